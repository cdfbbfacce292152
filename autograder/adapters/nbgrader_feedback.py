"""A preprocessor for plain nbgrader's `generate_feedback`, which otherwise shows the hidden tests.

nbgrader_config.py adds it to GenerateFeedback.preprocessors. In every test cell it removes the
hidden-test region from the source and shortens each error output to its last line (the check's
teaching message): a traceback would print the hidden test's code.
"""

from nbgrader.preprocessors import NbGraderPreprocessor

from autograder import notebook as nbk


class HideHiddenTests(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and nbk.is_test(cell):
            if nbk.BEGIN_HIDDEN in cell.source:
                cell.source = nbk.strip_hidden_tests(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
