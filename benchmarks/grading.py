"""Grading throughput: plain `nbgrader autograde` against `python -m autograder grade`, in one run,
on the same machine and the same submissions.

    python benchmarks/grading.py                       # 14 students x lessons 01-03 (42 notebooks)
    python benchmarks/grading.py --students 20 --lessons 01_attention
    python benchmarks/grading.py --json benchmarks/results/grading_cpu.json

The class is mixed: solved, blank and known-wrong submissions (tests/mutants). Prints seconds
per submission and the ratios against nbgrader.
"""
import argparse
import datetime
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder import notebook as nbk  # noqa: E402
from autograder.release import release  # noqa: E402
from tests import mutants  # noqa: E402
from tests.lessons import fill  # noqa: E402


def make_class(root, lessons, n_students):
    release(root / "release", lessons)
    for lesson in lessons:
        rel = nbk.read(root / "release" / lesson / f"{lesson}.ipynb")
        module = mutants.for_lesson(lesson)
        wrong = [(name, code) for name, items in module.MUTANTS.items() for _, _, code in items]
        kinds = itertools.cycle(["solved", "wrong", "solved", "blank", "wrong"])
        for i, kind in zip(range(n_students), kinds):
            if kind == "solved":
                nb = fill(rel, lesson)
            elif kind == "blank":
                nb = rel
            else:
                name, code = wrong[i % len(wrong)]
                nb = fill(rel, lesson, {name: code})
            nbk.write(nb, root / "submitted" / f"student{i:03d}" / lesson / f"{lesson}.ipynb")
    return root / "submitted"


def timed(cmd, cwd, env=None):
    start = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - start


def nbgrader_autograde(root, lessons):
    """The plain nbgrader path: generate_assignment (not timed), then autograde each lesson (timed)."""
    (root / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.source_directory = {str(REPO / 'lessons')!r}\n"
        "c.CourseDirectory.db_url = 'sqlite:///gradebook.db'\n"
        "c.Execute.timeout = 120\n")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    nbgrader = [str(Path(sys.executable).parent / "nbgrader")]
    for lesson in lessons:
        timed(nbgrader + ["generate_assignment", lesson, "--force"], root, env)
    return sum(timed(nbgrader + ["autograde", lesson, "--force"], root, env) for lesson in lessons)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--students", type=int, default=14)
    p.add_argument("--lessons", nargs="+", default=["01_attention", "02_heads", "03_multi_head"])
    p.add_argument("--skip-nbgrader", action="store_true", help="only time the course's grader")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    try:
        subs = make_class(root, args.lessons, args.students)
        n = args.students * len(args.lessons)
        grade = [sys.executable, "-m", "autograder", "grade", str(subs), "--quiet", "--lesson"]
        times = {}
        if not args.skip_nbgrader:
            times["nbgrader autograde"] = nbgrader_autograde(root, args.lessons)
        for jobs in (1, 2):
            cmd = grade[:-1] + sum((["--lesson", lesson] for lesson in args.lessons), []) + \
                ["--out", str(root / f"results{jobs}"), "--jobs", str(jobs)]
            times[f"autograder --jobs {jobs}"] = timed(cmd, REPO)
        base = times.get("nbgrader autograde")
        print(f"{n} submissions ({args.students} students x {', '.join(args.lessons)}), {os.cpu_count()} CPUs")
        print(f"{'':24s} {'total s':>8s} {'s/submission':>13s} {'throughput vs nbgrader':>23s}")
        for name, t in times.items():
            ratio = f"{base / t:.2f}x" if base else "-"
            print(f"{name:24s} {t:8.1f} {t / n:13.2f} {ratio:>23s}")
        if args.json:
            args.json.write_text(json.dumps({
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                "date": datetime.date.today().isoformat(), "submissions": n, "lessons": args.lessons,
                "runs": [{"command": name, "seconds": round(t, 1), "seconds_per_submission": round(t / n, 2),
                          "throughput_vs_nbgrader": round(base / t, 2) if base else None} for name, t in times.items()],
            }, indent=1) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
