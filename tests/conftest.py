import os
import tempfile

# Stored results are signed with a key kept outside RESULTS (autograder.results.KEY_ENV): the tests
# use one of their own, never the user's, and every CLI and Slurm job they start inherits it.
os.environ["MHA_RESULTS_KEY"] = os.path.join(tempfile.mkdtemp(prefix="mha-test-key-"), "results.key")

# Triton reads this when a kernel is defined, so it must be set before solutions.gpu is
# imported: without a GPU, kernels run in Triton's interpreter.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The checks compute many small references: one torch thread each is what the grader uses, and
# threads only fight over the cores here (several times the CPU for the same work).
import torch  # noqa: E402

torch.set_num_threads(1)

# The lesson folders' copies of the course's own modules (tripwires.py, triton_fit.py) are not in git: the
# source notebooks the tests run in place import them.
from autograder import notebook as _nbk  # noqa: E402
from autograder.sync import copy_own_modules  # noqa: E402

for _lesson in _nbk.lesson_names():
    copy_own_modules(_lesson, _nbk.read(_nbk.lesson_path(_lesson)))


# Tests that xdist hands out one by one, not with the rest of their file (`make test`, --dist loadfile): long, and
# needing no module fixture of their file that is costly to build again.
SPREAD = {"test_memory_bound_mutant_fails_its_check_only"}


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Spread())


class _Spread:
    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        """--dist loadfile, but for the tests of SPREAD: each is a unit of its own. xdist hands out the units with the
        most tests first, so these go last, where they even out the end of the run (lesson 09's memory-bound mutants,
        5 to 20 s each, held one process for the whole lesson)."""
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        class SpreadScheduling(LoadFileScheduling):
            def _split_scope(self, nodeid):
                file, _, test = nodeid.partition("::")
                return nodeid if test.split("[", 1)[0] in SPREAD else file

        return SpreadScheduling(config, log)
