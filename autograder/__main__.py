"""python -m autograder {release, grade, merge, sync}: a thin face over the stages."""
import argparse
import sys

from autograder.checks import LESSONS


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m autograder", description="The course's instructor commands.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("release", help="write the student copies of the lessons to OUT/<lesson>/")
    r.add_argument("out", metavar="OUT")
    r.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    g = sub.add_parser("grade", help="grade SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb into RESULTS")
    g.add_argument("submissions", metavar="SUBMISSIONS")
    g.add_argument("--out", required=True, metavar="RESULTS", help="where grades.csv and feedback/ go")
    g.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")
    g.add_argument("--jobs", type=int, default=1, metavar="N", help="grade N submissions at once")
    g.add_argument("--resume", action="store_true", help="skip submissions already graded in RESULTS")
    g.add_argument("--shard", metavar="i/N", help="grade only the i-th of N slices of the students (0-based)")
    g.add_argument("--sandbox", choices=["auto", "bwrap", "unshare", "none"], default="auto",
                   help="how student code is isolated (default: the strongest that works)")
    g.add_argument("--unsafe", action="store_true", help="allow grading without any sandbox")
    g.add_argument("--gradescope", action="store_true", help="also write gradescope/<student>/results.json")
    g.add_argument("--gradebook", metavar="DB", help="also update this nbgrader gradebook (e.g. gradebook.db)")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    for flag, key, unit in (("--cell-timeout", "cell_seconds", "s"), ("--call-timeout", "call_seconds", "s"),
                            ("--notebook-timeout", "notebook_seconds", "s"), ("--memory", "memory_mb", "MB")):
        g.add_argument(flag, type=int, dest=key, metavar=unit.upper(), help=f"limit per {key.split('_')[0]} ({unit})")

    m = sub.add_parser("merge", help="combine the RESULTS folders of sharded runs into one")
    m.add_argument("results", nargs="+", metavar="RESULTS")
    m.add_argument("--out", required=True, metavar="MERGED")
    m.add_argument("--gradescope", action="store_true")
    m.add_argument("--gradebook", metavar="DB")

    s = sub.add_parser("sync", help="rewrite the notebooks' solution and hidden-test cells from solutions/")
    s.add_argument("--lesson", action="append", choices=list(LESSONS))
    s.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of date")

    args = p.parse_args(argv)
    if args.command == "release":
        from autograder.release import release
        for path in release(args.out, args.lesson):
            print(path)
    elif args.command in ("grade", "merge"):
        return _grade_or_merge(args)
    elif args.command == "sync":
        from autograder.sync import sync
        changed = sync(args.lesson, check=args.check)
        for line in changed:
            print(("out of date: " if args.check else "synced: ") + line)
        return 1 if changed and args.check else 0
    return 0


def _grade_or_merge(args):
    from autograder.grade import GradeError, grade, parse_shard
    from autograder.report import merge
    from autograder.worker import SandboxError, choose_mode

    try:
        if args.command == "merge":
            results = merge(args.results, args.out, args.gradescope, args.gradebook)
        else:
            if args.jobs < 1:
                raise GradeError("--jobs must be at least 1")
            shard = parse_shard(args.shard) if args.shard else None
            mode = choose_mode(args.sandbox, args.unsafe)
            limits = {k: getattr(args, k) for k in ("cell_seconds", "call_seconds", "notebook_seconds", "memory_mb")
                      if getattr(args, k) is not None}
            results = grade(args.submissions, args.out, args.lesson, args.jobs, args.resume, shard, mode, limits,
                            args.gradescope, args.gradebook, progress=not args.quiet)
    except (GradeError, SandboxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    got = sum(t["points"] for r in results for t in r["tests"])
    full = sum(t["max_points"] for r in results for t in r["tests"])
    print(f"{len(results)} submissions, {got:g}/{full:g} points; wrote {args.out}/grades.csv and {args.out}/feedback/")
    if any(r.get("grader_errors") for r in results):
        print(f"the grader itself failed on some tests (status error): see {args.out}/grader-errors.log", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
