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
