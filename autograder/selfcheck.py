"""The reference, checked before anything is graded with it.

Every verdict compares a student's answer with solutions/. A reference changed by mistake (a clone
whose solutions/attention.py was edited) would grade a whole class wrong without a word, so
`grade` and `gradescope-bundle` first run, for each lesson they grade, a probe of every graded
name and of every reference helper its checks use (the stand-ins they send into the sandbox, the
modules they build references with). A probe compares the reference with what does not depend on
it, on a few small fixed inputs in float64: PyTorch's own implementations (torch.softmax,
F.scaled_dot_product_attention, nn.MultiheadAttention, torch.repeat_interleave)
or the definition written out index by index. 0.01 to 0.03 s of CPU per lesson (lesson 06: 0.5 s, Triton's
interpreter).

check_reference(lessons) raises ReferenceBroken, one line naming the lesson and the function.
"""

import importlib

import torch

from autograder import lessons as manifests
from autograder.checking.probing import PROBES, STAND_INS, Disagrees
from autograder.results import UsageError

__all__ = ["PROBES", "STAND_INS", "ReferenceBroken", "check_reference"]


class ReferenceBroken(UsageError):
    """A reference disagrees with PyTorch or with its definition: nothing may be graded with it."""


def load_probes():
    """Import every lesson's probes (autograder/lessons/<module>/probes.py), which fills PROBES."""
    for lesson in manifests.names():
        importlib.import_module(f"autograder.lessons.{manifests.read(lesson)['solutions']}.probes")


def check_reference(lessons):
    """Run every probe of these lessons; ReferenceBroken at the first reference that fails one."""
    for lesson in lessons:
        for target, fn in PROBES[lesson]:
            module, name = target.rsplit(".", 1)
            try:  # torch's global RNG is left as it was: the probes seed it to build models
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    fn(getattr(importlib.import_module(module), name))
            except Disagrees as e:
                why = str(e)
            except Exception as e:  # noqa: BLE001 (whatever a broken reference raises)
                why = f"it raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".rstrip(": ")
            else:
                continue
            raise ReferenceBroken(
                f"lesson {lesson}: the reference {target} is wrong ({why}); nothing was graded: "
                f"restore {module.replace('.', '/')}.py (git diff, git log) and run again"
            )


load_probes()
