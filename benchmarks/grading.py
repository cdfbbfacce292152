"""Grading cost: CPU seconds per extra submission for each lesson, with the sandbox's defences
and without them; and throughput against plain `nbgrader autograde` on the same submissions.

    python benchmarks/grading.py                       # every lesson; nbgrader on lessons 01-03
    python benchmarks/grading.py --lessons 01_attention --skip-nbgrader
    python benchmarks/grading.py --lessons --skip-child --json benchmarks/results/grading_cpu.json  # nbgrader only
    python benchmarks/grading.py --regrade --baseline main --lessons --skip-child --skip-nbgrader   # one regrade
    python benchmarks/grading.py --reading --lessons --skip-child --skip-nbgrader   # the grader reading big notebooks

--regrade: the wall time of `grade --resume` after one notebook of lessons 01-05 changed, in a class graded
before (3 students), the least of 5 runs, for this checkout and for --baseline (a commit, checked out with
`git archive` into a temporary folder, measured in the same run on the same class), with where the time goes:
Python and the imports, the grader's fingerprints, the reference self-check, one sandbox's start-up, and the
rest (grading the notebook, writing the reports).

The cost of one sandbox child alone (start, one cell, one request, clean-up) is measured too, and (--reading)
the grader's own CPU for reading large submissions: a correct lesson 06 notebook grown to 270,000 characters with
helpers holding long attribute chains, and notebooks at the size caps, each against a plain correct notebook
(issue 33: at most 2 s more).
The class is mixed: solved, blank and known-wrong submissions (tests/harness/mutants.py). A lesson's cost
per extra submission is the CPU time (the grader and every sandbox process, user + system) of
grading --students of them, less that of grading 2, over the difference (the least of two runs
each): the start-up of the grader and its worker is left out. "without defences" runs under
AUTOGRADER_TEST_UNPROTECTED=1 (autograder/worker.py): no seccomp, per-child namespaces, cgroups,
frame caps or integrity check.
"""

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder import notebook as nbk  # noqa: E402
from autograder.release import release  # noqa: E402
from autograder.worker import UNPROTECTED_ENV  # noqa: E402
from tests.harness import mutants  # noqa: E402
from tests.harness.lessons import fill  # noqa: E402


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


CPUACCT = "/sys/fs/cgroup/cpuacct"


def timed(cmd, cwd, env=None):
    """(wall seconds, CPU seconds of the command and of every process it started). The sandbox's
    processes are killed, not waited for, so their CPU reaches no rusage: where we may make a
    cpuacct cgroup (cgroup v1, root), the command runs in one and its usage is read from it."""
    group = Path(CPUACCT, f"grading-bench-{os.getpid()}")
    try:
        group.mkdir()
    except OSError:
        group = None
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    join = (lambda: Path(group, "cgroup.procs").write_text(str(os.getpid()))) if group else None
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=join)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if group:
        cpu = int(Path(group, "cpuacct.usage").read_text()) / 1e9
        for _ in range(100):  # the killed sandbox may take a moment to leave it
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)
    else:
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return wall, cpu


def cpu_per_extra_submission(root, lesson, n_students, envs, repeats=2):
    """{name: CPU seconds per submission beyond the first two} grading one lesson with one job, for
    each environment in envs; the least of `repeats` runs of each, interleaved, so that a busy
    machine or a slow start-up inflates no figure."""
    classes = {n: make_class(root / f"{lesson}-{n}", [lesson], n) for n in (2, n_students)}
    cpu = {}
    for i in range(repeats):
        for name, env in envs.items():
            for n, subs in classes.items():
                out = root / f"{lesson}-{n}" / f"results-{name}-{i}"
                t = timed(
                    [
                        sys.executable,
                        "-m",
                        "autograder",
                        "grade",
                        str(subs),
                        "--quiet",
                        "--lesson",
                        lesson,
                        "--out",
                        str(out),
                    ],
                    REPO,
                    env,
                )[1]
                cpu[name, n] = min(cpu.get((name, n), t), t)
    return {name: (cpu[name, n_students] - cpu[name, 2]) / (n_students - 2) for name in envs}


def nbgrader_autograde(root, lessons):
    """The plain nbgrader path: generate_assignment (not timed), then autograde each lesson (timed)."""
    (root / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.source_directory = {str(REPO / 'lessons')!r}\n"
        "c.CourseDirectory.db_url = 'sqlite:///gradebook.db'\n"
        "c.Execute.timeout = 120\n"
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    nbgrader = [str(Path(sys.executable).parent / "nbgrader")]
    for lesson in lessons:
        timed(nbgrader + ["generate_assignment", lesson, "--force"], root, env)
    return sum(timed(nbgrader + ["autograde", lesson, "--force"], root, env)[0] for lesson in lessons)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--students", type=int, default=12, help="students per lesson for the CPU figures")
    p.add_argument("--lessons", nargs="*", default=nbk.lesson_names(), help="lessons for the CPU figures (none: skip)")
    p.add_argument("--nbgrader-students", type=int, default=14)
    p.add_argument("--nbgrader-lessons", nargs="+", default=["01_attention", "02_heads", "03_multi_head"])
    p.add_argument("--skip-nbgrader", action="store_true", help="no throughput against nbgrader")
    p.add_argument("--skip-child", action="store_true", help="no CPU figure of one sandbox child")
    p.add_argument("--regrade", action="store_true", help="the wall time of one regrade with --resume, and its parts")
    p.add_argument("--reading", action="store_true", help="the grader's own CPU for reading large notebooks")
    p.add_argument("--baseline", metavar="COMMIT", help="with --regrade: measure this commit too, in the same run")
    p.add_argument(
        "--json",
        type=Path,
        help="also write the figures to this JSON file (sections not measured in this run are kept)",
    )
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    record = {}
    try:
        if not args.skip_child:
            record["cpu_per_child"] = per_child()
        if args.lessons:
            record["cpu_per_extra_submission"] = per_lesson(root, args.lessons, args.students)
        if args.regrade:
            record["regrade"] = regrade(root / "regrade", args.baseline)
        if args.reading:
            record["reading_cpu"] = reading(root / "reading")
        if not args.skip_nbgrader:
            record["throughput_vs_nbgrader"] = throughput(
                root / "throughput", args.nbgrader_lessons, args.nbgrader_students
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else {}
        old = {
            k: v
            for k, v in old.items()
            if k in ("cpu_per_child", "cpu_per_extra_submission", "throughput_vs_nbgrader", "regrade", "reading_cpu")
        }
        args.json.write_text(
            json.dumps(
                {
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                    **old,
                    **record,
                },
                indent=1,
            )
            + "\n"
        )


# ---- the grader's own reading of a submission (issue 33) ------------------------------------------

READING_LESSON = "06_gpu"  # a lesson whose checks read the cells on the grader's side (triton_replay)


def _with_code(nb, cells):
    """nb with code cells of the given sources appended."""
    nb = json.loads(json.dumps(nb))
    nb["cells"] += [
        {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None} for c in cells
    ]
    return nb


def _code_chars(nb):
    return sum(len(nbk.source(c)) for c in nb["cells"] if c["cell_type"] == "code")


def chains_notebook(plain, chars=270_000, depth=95, per_cell=40):
    """plain grown to `chars` characters of code with helper cells, each def holding an attribute chain `depth` long,
    subscripts between the links (the costliest form the source rules had to read)."""
    chain = "[0].".join(f"a{k}" for k in range(depth // 2))
    cells, i = [], 0
    while _code_chars(plain) + sum(map(len, cells)) < chars:
        cells.append("".join(f"def helper_{i}_{j}(obj):\n    return obj.{chain}\n\n" for j in range(per_cell)))
        i += 1
    return _with_code(plain, cells)


def capped_notebooks(plain):
    """{what: notebook} at the caps a submission is read under: code cells as long as the grader parses
    (check_submission.MAX_CELL_CHARS), up to as much as it parses in all (MAX_CODE_CHARS), dense or nested as deep as
    Python parses; and notebook.py's bytes, in such cells and in markdown."""
    from autograder import check_submission

    read = check_submission.MAX_CODE_CHARS - _code_chars(plain)
    room = nbk.MAX_NOTEBOOK_BYTES - len(json.dumps(plain)) - (1 << 20)  # JSON's escapes and each cell's fields
    per_cell = min(check_submission.MAX_CELL_CHARS, read) - 1000
    dense = "".join(f"x{i} = torch.zeros(3)[0] + y.b{i}(z)[1].c\n" for i in range(per_cell // 50))
    depth = 90  # calls nested in one expression: CPython's parser stops at 100 levels of brackets (200 in 3.12)
    nested = "".join("v{0} = {1}0{2}\n".format(i, "f(" * depth, ")" * depth) for i in range(per_cell // (4 * depth)))
    markdown = {"cell_type": "markdown", "metadata": {}, "source": "x" * room}
    big = json.loads(json.dumps(plain))
    big["cells"].append(markdown)
    return {
        "code the grader parses at its cap, dense": _with_code(plain, [dense] * (read // len(dense))),
        "code the grader parses at its cap, nested": _with_code(plain, [nested] * (read // len(nested))),
        "code at the byte cap, dense": _with_code(plain, [dense] * (room // len(dense))),
        f"{room >> 20} MiB of markdown": big,
    }


# What the grader's own process does with a lesson 06 submission's text, as often as one grading does: parse it, take
# its cells (grade.submission_cells), find the names only demo cells bind (check_submission.demo_only), and read the
# cells, up to Subject.readable_sources' bound, for each Triton check's replay (triton_replay: whether the kernel is
# Triton's alone, and its cells). Lesson 09's "D once" (d_per_pair) reads the same cells once more, in its own grading.
READ_ONE = """
import sys
from autograder import check_submission, grade
from autograder import notebook as nbk
from autograder.checking import Subject
from autograder.lessons.gpu import triton_replay
if sys.argv[1:]:
    nb = nbk.parse_submission(open(sys.argv[1], "rb").read())
    cells, _, _ = grade.submission_cells(nb)
    check_submission.demo_only(nb)
    try:
        sources = Subject(None, sources=cells).readable_sources()
    except AssertionError:  # the aspects that read them fail, saying why
        sources = []
    for kernel in ("_softmax_kernel", "_attention_kernel"):
        parsed = triton_replay._parsed(sources)
        try:
            triton_replay._kernel_is_triton(parsed, kernel)
        except AssertionError:
            pass
        triton_replay.kernel_cells(parsed)
"""


def reading(root, runs=3):
    """{notebook: its characters of code, its bytes, the grader's CPU seconds to read it and those beyond a plain
    correct notebook}: READ_ONE's work in a fresh interpreter, the least of `runs`, less that of a run reading
    nothing (Python and the imports)."""
    release(root / "release", [READING_LESSON])
    plain = fill(nbk.read(root / "release" / READING_LESSON / f"{READING_LESSON}.ipynb"), READING_LESSON)
    books = {
        "a plain correct notebook": plain,
        "270,000 characters, long attribute chains": chains_notebook(plain),
        **capped_notebooks(plain),
    }
    cpu = {}
    for name, nb in [("nothing", None), *books.items()]:
        path = root / "reading.ipynb"
        args = []
        if nb is not None:
            path.write_text(json.dumps(nb))
            args = [str(path)]
        cpu[name] = min(timed([sys.executable, "-c", READ_ONE, *args], REPO)[1] for _ in range(runs))
    base = cpu.pop("nothing")
    plain_cpu = cpu["a plain correct notebook"] - base
    figures = {}
    print(f"\nThe grader reading one submission, CPU s beyond Python and the imports (least of {runs})")
    for name, nb in books.items():
        seconds = cpu[name] - base
        figures[name] = {
            "code_chars": _code_chars(nb),
            "notebook_bytes": len(json.dumps(nb)),
            "cpu_s": round(seconds, 3),
            "beyond_plain_s": round(seconds - plain_cpu, 3),
        }
        print(f"{name:45s} {seconds:6.2f} ({seconds - plain_cpu:+.2f} beyond plain; {_code_chars(nb):,} chars of code)")
    return {"date": datetime.date.today().isoformat(), "lesson": READING_LESSON, "notebooks": figures}


CHILDREN = """
from autograder.worker import Sandbox, Session, choose_mode
sandbox = Sandbox(choose_mode("auto"), {{"memory_mb": 512}})
for _ in range({n}):
    session = Session(sandbox, "01_attention", ["x = 1"])
    session.open()
    session.transport({{"op": "has", "name": "x"}})
    session.close()
sandbox.close()
"""


def per_child(n=40):
    """CPU seconds of one submission's child in a warm sandbox (start it, run one cell, answer one
    request, kill and clean up), with and without the defences: their cost alone, without the
    noise of whole lessons. The least of two runs of n children, less a run of none."""
    envs = {"with": {k: v for k, v in os.environ.items() if k != UNPROTECTED_ENV}}
    envs["without"] = dict(envs["with"], **{UNPROTECTED_ENV: "1"})
    cpu = {}
    for _ in range(2):
        for name, env in envs.items():
            for count in (0, n):
                t = timed([sys.executable, "-c", CHILDREN.format(n=count)], REPO, env)[1]
                cpu[name, count] = min(cpu.get((name, count), t), t)
    figures = {name: round((cpu[name, n] - cpu[name, 0]) / n, 4) for name in envs}
    print(f"CPU seconds per sandbox child: {figures['with']:.4f} with the defences, {figures['without']:.4f} without")
    return {
        "date": datetime.date.today().isoformat(),
        "children": n,
        "with_defences": figures["with"],
        "without_defences": figures["without"],
        "defences_cost": round(figures["with"] - figures["without"], 4),
    }


def per_lesson(root, lessons, students):
    """Each lesson's CPU seconds per extra submission, with and without the sandbox's defences."""
    protected = {k: v for k, v in os.environ.items() if k != UNPROTECTED_ENV}
    unprotected = dict(protected, **{UNPROTECTED_ENV: "1"})
    figures = {}
    print(f"CPU seconds per extra submission ({students} students per lesson, --jobs 1, {os.cpu_count()} CPUs)")
    if not os.access(CPUACCT, os.W_OK):
        print("(no cpuacct cgroup here: the sandbox's own CPU time is not counted)")
    print(f"{'lesson':26s} {'with defences':>14s} {'without':>8s} {'cost':>7s}")
    for lesson in lessons:
        cpu = cpu_per_extra_submission(root, lesson, students, {"with": protected, "without": unprotected})
        figures[lesson] = {
            "with_defences": round(cpu["with"], 3),
            "without_defences": round(cpu["without"], 3),
            "defences_cost": round(cpu["with"] - cpu["without"], 3),
        }
        print(
            f"{lesson:26s} {cpu['with']:14.2f} {cpu['without']:8.2f} {cpu['with'] - cpu['without']:+7.2f}", flush=True
        )
    return {
        "date": datetime.date.today().isoformat(),
        "students_per_lesson": students,
        "jobs": 1,
        "counted": "the grader and every sandbox process, user + system (a cpuacct cgroup)"
        if os.access(CPUACCT, os.W_OK)
        else "the grader and the processes it waited for (rusage)",
        "seconds": figures,
    }


def throughput(root, lessons, students):
    """Wall time of plain nbgrader and of the grader (1 and 2 jobs) on one class; prints and returns the rows."""
    subs = make_class(root, lessons, students)
    n = students * len(lessons)
    times = {"nbgrader autograde": nbgrader_autograde(root, lessons)}
    for jobs in (1, 2):
        cmd = [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(subs),
            "--quiet",
            *sum((["--lesson", lesson] for lesson in lessons), []),
            "--out",
            str(root / f"results{jobs}"),
            "--jobs",
            str(jobs),
        ]
        times[f"autograder --jobs {jobs}"] = timed(cmd, REPO)[0]
    base = times["nbgrader autograde"]
    print(f"\n{n} submissions ({students} students x {', '.join(lessons)}), {os.cpu_count()} CPUs")
    print(f"{'':24s} {'total s':>8s} {'s/submission':>13s} {'throughput vs nbgrader':>23s}")
    for name, t in times.items():
        print(f"{name:24s} {t:8.1f} {t / n:13.2f} {base / t:22.2f}x")
    return {
        "date": datetime.date.today().isoformat(),
        "submissions": n,
        "lessons": lessons,
        "runs": [
            {
                "command": name,
                "seconds": round(t, 1),
                "seconds_per_submission": round(t / n, 2),
                "throughput_vs_nbgrader": round(base / t, 2),
            }
            for name, t in times.items()
        ],
    }


REGRADE_LESSONS = ["01_attention", "02_heads", "03_multi_head", "04_gqa", "05_kv_cache"]
PARTS = """
import sys, time
t0 = time.perf_counter()
import torch, autograder.grade as g
try:
    import autograder.checking
except ImportError:   # a commit before the layout move
    import autograder.checks
from autograder import notebook as nbk
from autograder.worker import Sandbox, choose_mode
t1 = time.perf_counter()
lessons, out = {lessons!r}, {out!r}
cache = g.Cache(out) if hasattr(g, "Cache") else None
tests = {{lesson: nbk.lesson_tests(lesson) for lesson in lessons}}
for lesson in lessons:
    g.lesson_fingerprint(lesson, tests[lesson], choose_mode("auto"), None, *([cache] if cache else []))
t2 = time.perf_counter()
if cache:
    g.check_references(lessons, cache)
else:
    from autograder.selfcheck import check_reference
    check_reference(lessons)
t3 = time.perf_counter()
preloads = [None, g.imports_triton(lessons)] if hasattr(g, "imports_triton") else []  # as grade starts it
Sandbox(choose_mode("auto"), g.lesson_limits(lessons[0]), *preloads).close()
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""


def regrade(root, baseline=None, runs=5):
    """{checkout: {wall, cpu, imports, fingerprints, self_check, sandbox_start}} in seconds: the least of `runs`
    regrades with --resume (the checkouts taken in turn) after one notebook (a student's lesson 03, solved and
    blank in turn) changed, in a class of 3 students x lessons 01-05 graded before; the parts are measured alone
    in a fresh interpreter, in the same RESULTS (so with what that checkout caches there)."""
    subs = make_class(root, REGRADE_LESSONS, 3)
    changed = subs / "student000" / "03_multi_head" / "03_multi_head.ipynb"
    versions = [changed.read_bytes(), (root / "release" / "03_multi_head" / "03_multi_head.ipynb").read_bytes()]
    checkouts = {"this checkout": REPO}
    if baseline:
        base = root / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", baseline], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        short = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", baseline], text=True)
        checkouts[f"{baseline} ({short.strip()})"] = base
    outs = {name: root / f"results-{i}" for i, name in enumerate(checkouts)}
    grades = {
        name: [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(outs[name]), "--quiet"]
        for name in checkouts
    }
    envs = {name: dict(os.environ, PYTHONPATH=str(code)) for name, code in checkouts.items()}
    for name, code in checkouts.items():
        timed(grades[name], code, envs[name])  # the class graded once
    walls, cpus = defaultdict(list), defaultdict(list)
    for i in range(runs):  # interleaved: a busy moment slows both checkouts, not one
        changed.write_bytes(versions[(i + 1) % 2])
        for name, code in checkouts.items():
            wall, cpu = timed(grades[name] + ["--resume"], code, envs[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
    changed.write_bytes(versions[0])
    figures = {}
    for name, code in checkouts.items():
        parts = [
            min(x)
            for x in zip(
                *(
                    map(
                        float,
                        subprocess.run(
                            [sys.executable, "-c", PARTS.format(lessons=REGRADE_LESSONS, out=str(outs[name]))],
                            cwd=code,
                            env=envs[name],
                            capture_output=True,
                            text=True,
                            check=True,
                        ).stdout.split(),
                    )
                    for _ in range(3)
                )
            )
        ]
        figures[name] = dict(
            wall=round(min(walls[name]), 2),
            cpu=round(min(cpus[name]), 2),
            **{k: round(v, 2) for k, v in zip(("imports", "fingerprints", "self_check", "sandbox_start"), parts)},
        )
    first = next(iter(figures.values()))
    for f in figures.values():  # this checkout's wall time over each one's, measured in the same run
        f["wall_vs_this"] = round(first["wall"] / f["wall"], 2)
    load = os.getloadavg()[0]  # a busy machine slows every figure: the ratios hold better than the seconds
    print(
        f"\nOne regrade (grade --resume, 1 of 15 notebooks changed, lessons 01-05), least of {runs}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f}; parts measured alone, least of 3"
    )
    print(
        f"{'':28s} {'wall s':>7s} {'this/it':>8s} {'CPU s':>6s} {'imports':>8s} {'fingerprints':>13s} "
        f"{'self-check':>11s} {'sandbox':>8s}"
    )
    for name, f in figures.items():
        print(
            f"{name:28s} {f['wall']:7.2f} {f['wall_vs_this']:8.2f} {f['cpu']:6.2f} {f['imports']:8.2f} "
            f"{f['fingerprints']:13.2f} {f['self_check']:11.2f} {f['sandbox_start']:8.2f}"
        )
    print("this/it: this checkout's wall time over the row's, measured in the same run (below 1: this one is faster)")
    return {"date": datetime.date.today().isoformat(), "runs": runs, "load_average": round(load, 1), "seconds": figures}


if __name__ == "__main__":
    main()
