"""The memory verdicts of lessons 06, 08 and 09 after every other check of theirs ran in one process (issue 19), and
where_it_differs' words; each lesson's own checks are judged in tests/lessons/test_<module>.py
(tests/harness/checks.py)."""

from tests.harness.checks import test_memory_verdicts_do_not_depend_on_what_ran_before  # noqa: F401 - collected here


def test_where_it_differs_gives_a_tail_only_to_sequences():
    """'the tail' is a sequence's last positions: the last heads or layers are only the last indices."""
    import numpy as np

    from autograder.checking.comparators import where_it_differs

    bad = np.zeros((2, 4, 6), dtype=bool)
    bad[:, 2:] = True
    assert where_it_differs(bad, ("B", "H", "T")) == "only in the last indices along H"
    bad = np.zeros((2, 4, 6), dtype=bool)
    bad[..., 4:] = True
    assert where_it_differs(bad, ("B", "H", "Tk")) == "only in the last positions along Tk (the tail)"
