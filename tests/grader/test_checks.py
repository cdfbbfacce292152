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


def test_expect_options_are_a_lessons_defaults_that_a_call_overrides():
    """expect_array judges and words a result as its Expect, with the call's keywords made over it: here the
    lesson's hint and axes, the call's own hint. A keyword Expect lacks is refused, not ignored."""
    import numpy as np
    import pytest

    from autograder.checking import Expect, expect_array, reference

    want = reference(np.zeros((2, 3)))
    got = reference(np.zeros((2, 3)) + np.array([0.0, 0.0, 1.0]))
    lesson = Expect(axes=("B", "T"), hint="the lesson's hint")
    with pytest.raises(AssertionError) as e:
        expect_array(got, want, "f(x)", (), lesson)
    assert (
        str(e.value)
        == "f(x) differs from the correct result (only in the last positions along T (the tail)): the lesson's hint"
    )
    with pytest.raises(AssertionError) as e:
        expect_array(got, want, "f(x)", (), lesson, hint="the call's hint")
    assert str(e.value).endswith(": the call's hint")
    expect_array(got, want, "f(x)", (), lesson, atol=2.0)  # within a looser tolerance
    with pytest.raises(TypeError):
        expect_array(want, want, "f(x)", (), lesson, hnt="a typo")
