"""python -m autograder merge RESULTS_0 ... --out MERGED: the results of sharded runs, as one run
would have written them. A shard set that is incomplete or inconsistent (a missing or repeated
index, different lessons, manifests or versions of the checks, a student in two shards) is
refused, unless --allow-partial, which merges what there is and marks the gaps."""

import sys
from collections import defaultdict
from pathlib import Path

from autograder import report
from autograder import results as store
from autograder.checking import LESSONS
from autograder.config import RunConfig


class MergeError(store.UsageError):
    pass


def shard_set_problems(runs, stored, manifest) -> list:
    """What is wrong with a set of RESULTS folders as the shards of one run (runs {folder: Run},
    stored {folder: [Result]}): [str]."""
    problems = []
    shards = {d: run.shard for d, run in runs.items()}
    if any(shards.values()):
        if not all(shards.values()):
            unsharded = ", ".join(str(d) for d, s in shards.items() if not s)
            problems.append(f"sharded and unsharded results mixed: {unsharded}")
        counts = {int(s.split("/")[1]) for s in shards.values() if s}
        if len(counts) > 1:
            problems.append(f"shards of different splits ({', '.join(f'N={n}' for n in sorted(counts))})")
        n = max(counts) if counts else 0
        seen = defaultdict(list)
        for d, s in shards.items():
            if s:
                seen[int(s.split("/")[0])].append(str(d))
        missing = [f"{i}/{n}" for i in range(n) if i not in seen]
        if missing:
            problems.append(f"missing shard{'s' * (len(missing) > 1)} {', '.join(missing)}")
        problems += [f"shard {i}/{n} given twice ({', '.join(ds)})" for i, ds in sorted(seen.items()) if len(ds) > 1]
    lessons = {d: tuple(sorted(run.lessons)) for d, run in runs.items()}
    if len(set(lessons.values())) > 1:
        problems.append(
            "different lessons graded: " + "; ".join(f"{d}: {', '.join(ls) or 'none'}" for d, ls in lessons.items())
        )
    ids = {run.manifest for run in runs.values()}
    if len(ids) > 1 or manifest and ids != {manifest["id"]}:
        problems.append(
            "graded from different class manifests"
            if len(ids) > 1
            else "not graded from this manifest (grade each shard with the same --manifest)"
        )
    graders, owner = defaultdict(set), {}
    for d, results in stored.items():
        for r in results:
            if r.grader:
                graders[r.lesson].add(r.grader)
            if owner.setdefault(r.student, d) != d:
                problems.append(f"student {r.student} is in two shards ({owner[r.student]} and {d})")
                owner[r.student] = d  # report each pair once
    problems += [
        f"{lesson} was graded by {len(g)} different versions of its checks, tests or limits: "
        "grade every shard with --resume again"
        for lesson, g in sorted(graders.items())
        if len(g) > 1
    ]
    if manifest:
        absent = sorted(set(manifest["students"]) - set(owner))
        if absent:
            problems.append(
                f"{len(absent)} student(s) of the manifest in no shard: {', '.join(absent[:5])}"
                + (" ..." if len(absent) > 5 else "")
            )
    return list(dict.fromkeys(problems))


def merge(config: RunConfig, dirs, outputs=()) -> list:
    """Copy every shard's results (the RESULTS folders `dirs`) into config.results (its other lessons are kept) and
    rewrite its reports (and the adapters' `outputs`, as report.write_all), with config.gradescope's files and the
    rule's written questions. Returns the results; MergeError when the shard set is not whole (checked against
    config.manifest, when given), unless config.allow_partial."""
    out = store.prepare_out(config.results)
    m = store.read_manifest(config.manifest) if config.manifest else None
    if len({Path(d).resolve() for d in dirs}) < len(dirs):
        raise MergeError("a RESULTS folder is given twice")
    runs, stored, refused, damaged, tests = {}, {}, {}, [], report.lesson_tests()
    for d in map(Path, dirs):
        if not (d / store.STORE).is_dir():
            raise MergeError(f"{d} holds no grading results (no {store.STORE}/ folder)")
        if d.resolve() == out.resolve():
            raise MergeError(f"--out {out} is also one of the folders to merge: merge into a folder of its own")
        term = store.load_term(d, tests)  # each result checked against d's own signed index
        runs[d], stored[d], refused[d] = store.read_run(d), term.results, term.refused
        damaged += term.lines
    problems = shard_set_problems(runs, stored, m) + damaged  # each names its file and why
    if problems and not config.allow_partial:
        raise MergeError(
            "refusing an incomplete or inconsistent shard set: "
            + "; ".join(problems)
            + " (--allow-partial merges what there is and marks the gaps)"
        )
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    lessons = set().union(*(run.lessons for run in runs.values())) & set(LESSONS)
    seen = set()
    for d in dirs:
        for r in stored[Path(d)]:
            if (r.student, r.lesson) not in seen:  # with --allow-partial, the first shard wins
                seen.add((r.student, r.lesson))
                store.save_result(out, r)
    for d in dirs:  # with --allow-partial, a refused or damaged result is left out, named, flagged for regrading
        for (student, lesson), why in sorted(refused[Path(d)].items()):
            if (student, lesson) not in seen and lesson in LESSONS and not store.check_student(student):
                seen.add((student, lesson))
                store.save_result(
                    out,
                    report.placeholder(
                        student,
                        lesson,
                        f"not graded: its stored result in {d} was refused ({why}); grade it with --resume",
                    ),
                )
    n = next((int(run.shard.split("/")[1]) for run in runs.values() if run.shard), 1)
    for i, student in enumerate(m["students"] if m else []):  # the gaps, named, flagged for regrading
        for lesson in sorted(lessons):
            if (student, lesson) not in seen:
                store.save_result(
                    out,
                    report.placeholder(
                        student, lesson, f"not graded: shard {i % n}/{n}, which holds this student, was not merged"
                    ),
                )
    old = store.read_run(out)
    store.write_run(
        out,
        None,
        m["id"] if m else next(iter({run.manifest for run in runs.values()})),
        set(old.lessons) | lessons,
        problems,
    )
    expected = {(s, x) for s in (m["students"] if m else []) for x in lessons}
    return report.write_all(out, expected, config.gradescope, outputs, written=config.rule.written)
