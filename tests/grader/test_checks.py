"""The memory verdicts of lessons 06, 08 and 09 after every other check of theirs ran in one process (issue 19),
where_it_differs' words, and which other names a mutant is verified against; each lesson's own checks are judged in
tests/lessons/test_<module>.py (tests/harness/checks.py)."""

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


def test_a_mutant_is_verified_against_every_name_that_can_see_it():
    """tests/harness/checks.mutant_case verifies the other names whose check, or the notebook code it reaches, reads
    a name the mutant's cell binds; every other name when the cell runs more than definitions, or when the check runs
    the cells again."""
    from tests.harness.checks import _cell_binds, _reads
    from tests.harness.lessons import answers, fresh_namespace

    assert _cell_binds("import torch.nn as nn\nimport math\nBLOCK = 16\ndef f():\n    global g\n") == (
        {"nn", "math", "BLOCK", "f", "g"},
        False,
    )
    assert _cell_binds('"""doc"""\ndef f():\n    pass\n_buf = torch.empty(1 << 20)\n')[1]
    reads = {
        lesson: {name: _reads(lesson, name, ns) for name in names}
        for lesson, names, ns in [
            (lesson, names, fresh_namespace(lesson))
            for lesson, names in [
                ("02_heads", ["per_head_attention", "split_heads"]),
                ("09_flash_backward", ["FlashAttention", "attention_backward"]),
                ("06_gpu", ["triton_attention", "flash_attention"]),
            ]
        ]
    }
    # it calls both, isolated: the grader's stand-ins run in their place while it runs; a helper of split_heads's cell
    # that it calls is its own code's
    assert not {"split_heads", "attention"} & reads["02_heads"]["per_head_attention"]
    cells = {name: answers("02_heads")[name] for name in ("split_heads", "per_head_attention")}
    cells["split_heads"] += "\n\ndef _split(x, n_heads):\n    return split_heads(x, n_heads)\n"
    cells["per_head_attention"] = cells["per_head_attention"].replace("split_heads(x @ w", "_split(x @ w")
    assert "_split" in _reads("02_heads", "per_head_attention", fresh_namespace("02_heads", cells))
    flash = {"flash_attention_forward", "flash_attention_backward"}
    assert not flash & reads["09_flash_backward"]["FlashAttention"]
    assert "_softmax_kernel" in reads["06_gpu"]["triton_attention"]  # its replay runs every cell's kernels
    assert "online_softmax" not in reads["06_gpu"]["triton_attention"]
    assert "triton_softmax" not in reads["06_gpu"]["flash_attention"]


def test_unseen_seeds_are_a_runs_own_and_once_per_run_is_a_threads_own(monkeypatch):
    """unseen_seed gives the same seed for the same check in one run (so Subject.once_per_run works the grader's side
    out once) and another in another run (RUN_KEY); once_per_run keeps a value per key in each grading thread, none
    shared between threads, and in-process (LocalSubject) keeps none."""
    import secrets
    import threading

    import numpy as np

    from autograder.checking import LocalSubject, Subject, subject, unseen_seed

    rng = lambda: np.random.default_rng(7)  # noqa: E731 - a check's rng, seeded from its name
    first = unseen_seed(rng())
    assert unseen_seed(rng()) == first and 0 <= first < 2**31
    monkeypatch.setattr(subject, "RUN_KEY", secrets.token_bytes(16))
    assert unseen_seed(rng()) != first

    made = []
    make = lambda: made.append(1) or object()  # noqa: E731
    s = Subject(lambda request: {"ok": None})
    value = s.once_per_run(("test", 1), make)
    assert s.once_per_run(("test", 1), make) is value and len(made) == 1
    there = []
    thread = threading.Thread(target=lambda: there.append(s.once_per_run(("test", 1), make)))
    thread.start()
    thread.join()
    assert there[0] is not value and len(made) == 2
    local = LocalSubject({})
    assert local.once_per_run(("test", 1), make) is not local.once_per_run(("test", 1), make) and len(made) == 4
