import os

# Triton reads this when a kernel is defined, so it must be set before solutions.gpu is
# imported: without a GPU, kernels run in Triton's interpreter.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
