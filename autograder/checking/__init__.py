"""The machinery every lesson's hidden checks share; the checks themselves live in
autograder/lessons/<module>/checks.py.

A check draws inputs, runs the student's code through a Subject and compares the result with
solutions/ in this process. It raises AssertionError with a message that names the likely
mistake, never the hidden inputs, expected values or code. The same check runs two ways:

- in the notebook, as a hidden test (plain nbgrader):  verify("01_attention", "softmax", globals())
- in the grader, against code in a sandbox (RemoteSubject in autograder.grade).

A check sees only plain data (numpy arrays in wire.Array, numbers, handles), whichever way it runs.
The modules: registry (Check, Checks, verify), subject (Subject and its errors), comparators (reference,
expect_*), memory (the in-process bound and the memory constants), mistakes (the known mistakes' loader),
stand_ins (correct helpers sent into the sandbox, as text).
"""

from autograder.checking.comparators import (
    TOLERANCE,
    Expect,
    as_torch,
    call_named,
    call_within_memory,
    changed_arguments,
    close,
    dtype_ok,
    expect_array,
    expect_error,
    expect_int,
    expect_int_attributes,
    expect_pair,
    fail,
    keeps_argument,
    kind_of,
    reference,
    where_it_differs,
    within_memory,
)
from autograder.checking.memory import GLIBC_SLACK_MB, HEADROOM_MB, HELD_NOTE_MB, evidence_times
from autograder.checking.registry import LESSONS, Check, Checks, PartialCredit, checks_for, verify
from autograder.checking.subject import (
    MAX_STUDENT_MESSAGE,
    NOT_IMPLEMENTED,
    STAND_INS,
    LocalSubject,
    OverBudget,
    Regrade,
    StudentError,
    Subject,
    Unchecked,
    student_message,
    tensor,
    unseen_seed,
)

__all__ = [
    "TOLERANCE",
    "Expect",
    "as_torch",
    "call_named",
    "call_within_memory",
    "close",
    "dtype_ok",
    "expect_array",
    "expect_error",
    "expect_int",
    "expect_int_attributes",
    "expect_pair",
    "fail",
    "changed_arguments",
    "keeps_argument",
    "kind_of",
    "reference",
    "where_it_differs",
    "within_memory",
    "GLIBC_SLACK_MB",
    "HEADROOM_MB",
    "HELD_NOTE_MB",
    "evidence_times",
    "LESSONS",
    "Check",
    "Checks",
    "PartialCredit",
    "checks_for",
    "verify",
    "MAX_STUDENT_MESSAGE",
    "NOT_IMPLEMENTED",
    "STAND_INS",
    "LocalSubject",
    "OverBudget",
    "Regrade",
    "StudentError",
    "Subject",
    "Unchecked",
    "student_message",
    "tensor",
    "unseen_seed",
]
