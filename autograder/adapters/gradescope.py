"""Gradescope: an autograder zip for one lesson, and the script it runs (results.json itself is
written by report.results_json).

Gradescope's contract (https://gradescope-autograders.readthedocs.io/en/latest/specs/): the zip
holds `setup.sh` (run once, as root, when Gradescope builds the autograder's Ubuntu image) and
`run_autograder` (run for every submission, with the student's files in /autograder/submission
and the zip's contents in /autograder/source); `run_autograder` writes
/autograder/results/results.json. Students never see /autograder/source, where the course
(solutions, hidden checks, source notebook) lives.

`python -m autograder gradescope-bundle --lesson L --out autograder_L.zip` writes the zip;
`run_autograder` calls `python -m autograder.adapters.gradescope ROOT` (this module).
"""

import importlib.metadata
import json
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from autograder import lessons

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
REPO = Path(__file__).resolve().parents[2]
CONFIG = "gradescope.json"  # the bundle's settings, next to setup.sh in /autograder/source
STUDENT = "submission"  # Gradescope grades one submission at a time: its folder's name
EXTRAS = lessons.extras()  # {lesson: pyproject extras its grading needs}, from its manifest (lesson 06: Triton)
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def _course_files(lesson):
    """(path in the zip, file) of the course a lesson's grading needs: the package's metadata,
    solutions/, autograder/ and that lesson's folder; no other lesson, no tests, no caches."""
    files = [REPO / name for name in ("pyproject.toml", "README.md")]
    for folder in ("solutions", "autograder", f"lessons/{lesson}"):
        files += [
            f
            for f in sorted((REPO / folder).rglob("*"))
            if f.is_file()
            and not any(part.startswith(".") or part == "__pycache__" for part in f.relative_to(REPO).parts)
        ]
    return [(f"course/{f.relative_to(REPO).as_posix()}", f) for f in files]


def setup_script(lesson):
    """setup.sh: Python, bubblewrap, a venv with CPU torch and the course (editable), then a check that
    everything grading imports is there (the sandbox's preload, the lesson's checks, the reference's
    self-check), so that a missing package fails the image's build, not every submission.
    Safe to run again: it reuses the venv and installs only what is missing. GRADESCOPE_TORCH (a pip
    spec) and GRADESCOPE_TORCH_INDEX (empty: pip's own configured index) change where torch comes from."""
    extra = f"[{','.join(EXTRAS[lesson])}]" if lesson in EXTRAS else ""
    torch = f"torch=={importlib.metadata.version('torch').split('+')[0]}"  # the torch this was tested with
    return f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 24.04 base).
# Running it again reuses the venv and installs only what is missing.
set -euo pipefail
root="${{GRADESCOPE_ROOT:-/autograder}}"
torch="${{GRADESCOPE_TORCH:-{torch}}}"
index="${{GRADESCOPE_TORCH_INDEX-{CPU_TORCH_INDEX}}}"
packages="python3 python3-venv python3-pip bubblewrap"
if ! dpkg -s $packages >/dev/null 2>&1; then
    apt-get install -y -q --no-install-recommends $packages || (apt-get update -q && apt-get install -y -q $packages)
fi
[ -x "$root/venv/bin/python" ] || /usr/bin/python3 -m venv "$root/venv"
python="$root/venv/bin/python"
# torch for the CPU (a small wheel); the default index if that one is unreachable.
if [ -n "$index" ]; then
    "$python" -m pip install --quiet "$torch" --index-url "$index" || "$python" -m pip install --quiet "$torch"
else
    "$python" -m pip install --quiet "$torch"
fi
# Editable, so that solutions/ and the hidden checks stay in $root/source instead of being copied
# into the venv, which the sandboxed student code can read.
"$python" -m pip install --quiet -e "$root/source/course{extra}"
# Everything grading imports, and the reference against this torch: a failure here fails the build.
# (The reference first: solutions.gpu sets Triton's interpreter up before anything imports Triton.)
"$python" -c "from autograder.selfcheck import check_reference; check_reference(['{lesson}'])
from autograder.checking import checks_for; checks_for('{lesson}')
from autograder.sandbox.runner import preload; preload()"
# Only root may enter the course: a sandbox that runs student code under another uid cannot read it.
chmod 0700 "$root/source"
echo "setup.sh: the {lesson} autograder is ready"
"""


RUN_SCRIPT = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade /autograder/submission with the sandboxed
# grader and write /autograder/results/results.json. GRADESCOPE_ROOT and GRADESCOPE_PYTHON
# move it elsewhere (to test a bundle outside Gradescope).
root="${GRADESCOPE_ROOT:-/autograder}"
cd "$root/source/course" && exec "${GRADESCOPE_PYTHON:-$root/venv/bin/python}" -m autograder.adapters.gradescope "$root"
"""


def bundle(lesson, out, visibility="visible", test_visibility="visible", stdout_visibility="hidden"):
    """Write the autograder zip for one lesson (one Gradescope assignment); returns its path."""
    from autograder import notebook as nbk
    from autograder.results import UsageError

    if not nbk.lesson_path(lesson).exists():
        raise UsageError(f"unknown lesson {lesson!r}; lessons are {', '.join(nbk.lesson_names())}")
    for name, value in (
        ("visibility", visibility),
        ("test visibility", test_visibility),
        ("stdout visibility", stdout_visibility),
    ):
        if value not in VISIBILITIES:
            raise UsageError(f"{name} must be one of {', '.join(VISIBILITIES)}, got {value!r}")
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"{out} is a folder: give the zip file's path")
    from autograder.selfcheck import check_reference

    check_reference([lesson])  # the bundle carries solutions/: never a reference changed by mistake
    config = dict(
        lesson=lesson,
        visibility=visibility,
        test_visibility=test_visibility,
        stdout_visibility=stdout_visibility,
        max_score=sum(p for _, p in nbk.lesson_tests(lesson)),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text, mode in (
            ("setup.sh", setup_script(lesson), 0o755),
            ("run_autograder", RUN_SCRIPT, 0o755),
            (CONFIG, json.dumps(config, indent=1) + "\n", 0o644),
        ):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
        for name, path in _course_files(lesson):
            z.write(path, name)
    tmp.replace(out)
    return out


def stage_submission(uploaded, dest, lesson):
    """Copy the uploaded notebooks into dest (SUBMISSIONS/<student>/<lesson>/): the one named
    <lesson>.ipynb if there is one, else every notebook, for the grader to choose or refuse.
    Links are not followed: they could point at the course."""
    uploaded = Path(uploaded)
    found = sorted(
        p
        for p in uploaded.rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
        and p.is_file()
        and not any((uploaded / q).is_symlink() for q in [p.relative_to(uploaded), *p.relative_to(uploaded).parents])
    )
    named = [p for p in found if p.name == f"{lesson}.ipynb"]
    dest.mkdir(parents=True)
    for i, p in enumerate(named[:1] or found):
        target = dest / p.name
        shutil.copyfile(p, target if not target.exists() else dest / f"{i}-{p.name}")


def run(root):
    """Grade ROOT/submission as ROOT/source's lesson; write ROOT/results/results.json. Returns the
    exit status: 1 (and no results.json, so Gradescope reports a failure to rerun rather than a
    zero) when the grader itself cannot run or cannot check a test (a missing Triton, a bug of ours)."""
    from autograder.config import RunConfig
    from autograder.grade import grade
    from autograder.report import results_json
    from autograder.results import UsageError, write_atomic
    from autograder.worker import SandboxError, choose_mode

    root = Path(root)
    config = json.loads((root / "source" / CONFIG).read_text(encoding="utf-8"))
    lesson, start = config["lesson"], time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        subs = Path(tmp) / "submissions"
        stage_submission(root / "submission", subs / STUDENT / lesson, lesson)
        try:
            results = grade(
                RunConfig(Path(tmp) / "results", subs, lessons=(lesson,), mode=choose_mode("auto"), progress=False)
            )["results"]
        except (UsageError, SandboxError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    broken = [t for r in results for t in r.tests if t.grader_error]
    if broken:  # the grader could not decide these: a zero would be a wrong grade. One line, each cause once
        causes = "; ".join(dict.fromkeys(t.message for t in broken))
        print(f"error: the grader could not check {len(broken)} test(s) of {lesson}: {causes}", file=sys.stderr)
        return 1
    data = results_json(results, config["visibility"], config["test_visibility"], config["stdout_visibility"])
    data["execution_time"] = round(time.monotonic() - start)
    write_atomic(root / "results" / "results.json", json.dumps(data, indent=1))
    print(f"{lesson}: {data['score']:g} / {config['max_score']:g} points")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
