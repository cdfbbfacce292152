# The course's commands. `make setup` then `make test` is all a fresh machine needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The torch that CI tests (a small CPU wheel here). Any torch>=2.5 works: `make setup TORCH=torch`.
TORCH  ?= torch==2.13.0

.PHONY: setup system-packages lint test test-fast gpu-check book release clean

setup: system-packages
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet -e ".[dev,book,gpu]"
	$(PY) -m autograder sync  # beside the lessons that import them: the course's own modules, not in git

# System tools: bubblewrap (the grader's sandbox), Chromium (the book's browser test), npm
# (MathJax for the book), and Slurm with munge (a one-node cluster in tests/deploy/test_slurm.py).
# Installed when we are root with apt-get; otherwise the tests that need them say so.
system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    missing=""; \
	    command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	    command -v chromium >/dev/null || missing="$$missing chromium"; \
	    [ -x /usr/sbin/slurmctld ] || command -v slurmctld >/dev/null || missing="$$missing slurm-wlm"; \
	    [ -x /usr/sbin/munged ] || command -v munged >/dev/null || missing="$$missing munge"; \
	    if [ -n "$$missing" ]; then \
	        (apt-get install -y -q $$missing || (apt-get update -q && apt-get install -y -q $$missing)) >/dev/null \
	        || echo "could not install$$missing: the tests that need them will be skipped"; \
	    fi; \
	else echo "not root with apt-get: install bubblewrap, chromium, slurm-wlm and munge yourself for the sandbox, browser and Slurm tests"; fi

# Ruff's checks and format (pyproject.toml's [tool.ruff]) and the notebooks in sync with solutions/.
lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m autograder sync --check

# Two test processes or more (each test file stays in one, so its shared fixtures are built once, but for the tests
# that tests/conftest.py's SPREAD names, handed out one by one; a lesson's tests are one file,
# tests/lessons/test_<module>.py, so the lessons spread over the processes): the grading runs wait on sandboxes as
# much as they compute.
XDIST := -n auto --maxprocesses 4 --dist loadfile

test:
	$(PY) -m pytest -q $(XDIST)

# The quick loop while writing code: no notebooks, no grading runs, no book.
test-fast:
	$(PY) -m pytest -q $(XDIST) -m "not slow"

# On a machine with an NVIDIA GPU: the GPU tests, lessons 06 and 09, the GPU benchmarks and the fit report, in
# about 8 minutes (benchmarks/gpu_check.py). Needs only torch and Triton: the venv's Python if `make setup` made
# one, else python3. Without a GPU it says so and exits 0.
gpu-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) benchmarks/gpu_check.py

book:
	$(PY) book/build.py

release:
	$(PY) -m autograder release release

clean:
	rm -rf release submitted autograded feedback results book/_build book/_generated gradebook.db
