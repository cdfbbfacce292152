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

    s = sub.add_parser("sync", help="rewrite the notebooks' solution and hidden-test cells from solutions/")
    s.add_argument("--lesson", action="append", choices=list(LESSONS))
    s.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of date")

    args = p.parse_args(argv)
    if args.command == "release":
        from autograder.release import release
        for path in release(args.out, args.lesson):
            print(path)
    elif args.command == "sync":
        from autograder.sync import sync
        changed = sync(args.lesson, check=args.check)
        for line in changed:
            print(("out of date: " if args.check else "synced: ") + line)
        return 1 if changed and args.check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
