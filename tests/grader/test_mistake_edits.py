"""A known mistake made by editing the reference's text (checking.mistakes.edited) whose text the reference no
longer holds, after a reformat, is a bug of ours: the test is an error flagged for regrading, never a failure whose
message is the stale text (lesson 03's mha_param_count once told students `q, k, v = (proj(t)`)."""

import pytest

from autograder.checking import Check, Subject
from autograder.checking.mistakes import edited
from autograder.grade import run_check

CODE = "q, k, v = (\n    proj(t) for proj, t in pairs\n)\n"


def test_an_edit_that_applies_changes_the_code():
    assert edited(CODE, ("proj(t)", "proj.weight @ t")) == "q, k, v = (\n    proj.weight @ t for proj, t in pairs\n)\n"


def test_an_edit_the_reference_no_longer_holds_is_ours_to_fix_not_the_students():
    with pytest.raises(LookupError, match="no longer"):
        edited(CODE, ("q, k, v = (proj(t)", "q, k, v = (F.linear(t, proj.weight)"))

    def body(s):
        with s.aspect("count"):  # a check that names the likely mistake only when the answer is wrong
            edited(CODE, ("q, k, v = (proj(t)", "q, k, v = (F.linear(t, proj.weight)"))

    row = run_check(Check("f", body, aspects={"count": 1}), Subject(lambda request: {}), 1.0)
    assert (row["status"], row["grader_error"]) == ("error", True)
    assert "proj(t)" not in row["message"] and "LookupError" in row["traceback"]
