"""The memory verdicts of lessons 06, 08 and 09 after every other check of theirs ran in one process (issue 19); each
lesson's own checks are judged in tests/lessons/test_<module>.py (tests/harness/checks.py)."""
from tests.harness.checks import test_memory_verdicts_do_not_depend_on_what_ran_before  # noqa: F401 - collected here
