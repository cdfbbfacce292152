"""Grading cost: CPU seconds per extra submission for each lesson, with the sandbox's defences
and without them; and throughput against plain `nbgrader autograde` on the same submissions.

    python benchmarks/grading.py                       # every lesson; nbgrader on lessons 01-03
    python benchmarks/grading.py --lessons 01_attention --skip-nbgrader
    python benchmarks/grading.py --lessons --skip-child --json benchmarks/results/grading_cpu.json  # nbgrader only

The cost of one sandbox child alone (start, one cell, one request, clean-up) is measured too, and
(--reading) the grader's own CPU for reading large submissions: a correct lesson 06 notebook grown to
270,000 characters with helpers holding long attribute chains, and notebooks at the size caps
(source_rules' and notebook.py's), each against a plain correct notebook (issue 33: at most 2 s more).
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder import notebook as nbk  # noqa: E402
from autograder.release import release  # noqa: E402
from tests.harness import mutants  # noqa: E402
from autograder.worker import UNPROTECTED_ENV  # noqa: E402
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
                t = timed([sys.executable, "-m", "autograder", "grade", str(subs), "--quiet", "--lesson", lesson,
                           "--out", str(out)], REPO, env)[1]
                cpu[name, n] = min(cpu.get((name, n), t), t)
    return {name: (cpu[name, n_students] - cpu[name, 2]) / (n_students - 2) for name in envs}


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
    return sum(timed(nbgrader + ["autograde", lesson, "--force"], root, env)[0] for lesson in lessons)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--students", type=int, default=12, help="students per lesson for the CPU figures")
    p.add_argument("--lessons", nargs="*", default=nbk.lesson_names(), help="lessons for the CPU figures (none: skip)")
    p.add_argument("--nbgrader-students", type=int, default=14)
    p.add_argument("--nbgrader-lessons", nargs="+", default=["01_attention", "02_heads", "03_multi_head"])
    p.add_argument("--skip-nbgrader", action="store_true", help="no throughput against nbgrader")
    p.add_argument("--skip-child", action="store_true", help="no CPU figure of one sandbox child")
    p.add_argument("--reading", action="store_true", help="only the grader's own CPU for reading large notebooks")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file (sections not measured "
                                                 "in this run are kept)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    record = {}
    try:
        if args.reading:
            record["reading_cpu"] = reading(root)
        elif not args.skip_child:
            record["cpu_per_child"] = per_child()
        if args.lessons and not args.reading:
            record["cpu_per_extra_submission"] = per_lesson(root, args.lessons, args.students)
        if not args.skip_nbgrader and not args.reading:
            record["throughput_vs_nbgrader"] = throughput(root / "throughput", args.nbgrader_lessons,
                                                          args.nbgrader_students)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else {}
        old = {k: v for k, v in old.items() if k in ("cpu_per_child", "cpu_per_extra_submission", "throughput_vs_nbgrader",
                                                     "reading_cpu")}
        args.json.write_text(json.dumps({
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs", **old, **record,
        }, indent=1) + "\n")


# ---- the grader's own reading of a submission (issue 33) ------------------------------------------

READING_LESSON = "06_gpu"  # the lesson whose cells the grader reads (source_rules)


def _with_code(nb, cells):
    """nb with code cells of the given sources appended."""
    nb = json.loads(json.dumps(nb))
    nb["cells"] += [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
                    for c in cells]
    return nb


def _code_chars(nb):
    return sum(len(nbk.source(c)) for c in nb["cells"] if c["cell_type"] == "code")


def chains_notebook(plain, chars=270_000, depth=95, per_cell=40):
    """plain grown to `chars` characters of code with helper cells, each def holding an attribute chain `depth` long
    (subscripts between the links: the costliest form to read, and as deep as the rules read)."""
    chain = "[0].".join(f"a{k}" for k in range(depth // 2))
    cells, i = [], 0
    while _code_chars(plain) + sum(map(len, cells)) < chars:
        cells.append("".join(f"def helper_{i}_{j}(obj):\n    return obj.{chain}\n\n" for j in range(per_cell)))
        i += 1
    return _with_code(plain, cells)


def capped_notebooks(plain):
    """{what: notebook} at the caps the grader reads under: source_rules' total and per-cell characters in dense code
    and nested as deep as it reads, and notebook.py's bytes in markdown."""
    from autograder import source_rules as rules

    room = rules.MAX_TOTAL_CHARS - _code_chars(plain) - 1000
    per_cell = min(rules.MAX_CELL_CHARS - 1000, room)
    dense = "".join(f"x{i} = torch.zeros(3)[0] + y.b{i}(z)[1].c\n" for i in range(per_cell // 40))
    depth = rules.MAX_DEPTH // 2 - 5  # each level a call and its argument
    nested = "".join("v{0} = {1}0{2}\n".format(i, "f(" * depth, ")" * depth) for i in range(per_cell // (4 * depth)))
    markdown = {"cell_type": "markdown", "metadata": {}, "source": "x" * (nbk.MAX_NOTEBOOK_BYTES // 2)}
    big = json.loads(json.dumps(plain))
    big["cells"].append(markdown)
    return {"code at the total cap, dense": _with_code(plain, [dense] * (room // len(dense))),
            "code at the total cap, nested to the depth cap": _with_code(plain, [nested] * (room // len(nested))),
            f"{nbk.MAX_NOTEBOOK_BYTES >> 21} MB of markdown": big}


READ_ONE = """
import json, sys
from autograder import grade
from autograder import notebook as nbk
from autograder.lessons.gpu import triton_evidence
data = open(sys.argv[1], "rb").read()
nb = nbk.parse_submission(data)
cells, _, _ = grade.submission_cells(nb)
print(json.dumps(triton_evidence.problems(cells)))
"""


def reading(root):
    """The grader's own CPU seconds (its process and the reading's, user + system) to parse a submission, take its
    cells and read them with the source rules (triton_evidence.problems, bounded), for each large notebook against a
    plain correct one: the least of three runs, less that of an empty run (Python and the imports)."""
    release(root / "release", [READING_LESSON])
    plain = fill(nbk.read(root / "release" / READING_LESSON / f"{READING_LESSON}.ipynb"), READING_LESSON)
    books = {"a plain correct notebook": plain, "270,000 characters, long attribute chains": chains_notebook(plain),
             **capped_notebooks(plain)}
    cpu = {}
    for name, nb in [("nothing", None), *books.items()]:
        path = root / "reading.ipynb"
        path.write_text(json.dumps(nb) if nb else "")
        script = READ_ONE if nb else "from autograder import grade\nfrom autograder.lessons.gpu import triton_evidence"
        cpu[name] = min(timed([sys.executable, "-c", script, str(path)], REPO)[1] for _ in range(3))
    base = cpu.pop("nothing")
    plain_cpu = cpu["a plain correct notebook"] - base
    figures = {}
    for name, nb in books.items():
        seconds = cpu[name] - base
        figures[name] = {"code_chars": _code_chars(nb), "notebook_bytes": len(json.dumps(nb)),
                         "cpu_s": round(seconds, 3), "beyond_plain_s": round(seconds - plain_cpu, 3)}
        print(f"reading {name}: {seconds:.2f} CPU s ({seconds - plain_cpu:+.2f} s beyond a plain correct notebook; "
              f"{figures[name]['code_chars']:,} characters of code)")
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
    return {"date": datetime.date.today().isoformat(), "children": n, "with_defences": figures["with"],
            "without_defences": figures["without"], "defences_cost": round(figures["with"] - figures["without"], 4)}


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
        figures[lesson] = {"with_defences": round(cpu["with"], 3), "without_defences": round(cpu["without"], 3),
                           "defences_cost": round(cpu["with"] - cpu["without"], 3)}
        print(f"{lesson:26s} {cpu['with']:14.2f} {cpu['without']:8.2f} {cpu['with'] - cpu['without']:+7.2f}",
              flush=True)
    return {"date": datetime.date.today().isoformat(), "students_per_lesson": students, "jobs": 1,
            "counted": "the grader and every sandbox process, user + system (a cpuacct cgroup)"
            if os.access(CPUACCT, os.W_OK) else "the grader and the processes it waited for (rusage)",
            "seconds": figures}


def throughput(root, lessons, students):
    """Wall time of plain nbgrader and of the grader (1 and 2 jobs) on one class; prints and returns the rows."""
    subs = make_class(root, lessons, students)
    n = students * len(lessons)
    times = {"nbgrader autograde": nbgrader_autograde(root, lessons)}
    for jobs in (1, 2):
        cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--quiet",
               *sum((["--lesson", lesson] for lesson in lessons), []), "--out", str(root / f"results{jobs}"),
               "--jobs", str(jobs)]
        times[f"autograder --jobs {jobs}"] = timed(cmd, REPO)[0]
    base = times["nbgrader autograde"]
    print(f"\n{n} submissions ({students} students x {', '.join(lessons)}), {os.cpu_count()} CPUs")
    print(f"{'':24s} {'total s':>8s} {'s/submission':>13s} {'throughput vs nbgrader':>23s}")
    for name, t in times.items():
        print(f"{name:24s} {t:8.1f} {t / n:13.2f} {base / t:22.2f}x")
    return {"date": datetime.date.today().isoformat(), "submissions": n, "lessons": lessons,
            "runs": [{"command": name, "seconds": round(t, 1), "seconds_per_submission": round(t / n, 2),
                      "throughput_vs_nbgrader": round(base / t, 2)} for name, t in times.items()]}


if __name__ == "__main__":
    main()
