"""The commit-msg hook (.pre-commit-config.yaml): refuse a commit message whose subject is empty, longer than 72
characters, or a merge's default ("Merge branch 'x'"), which says where a merge came from, not what it brings.

    .venv/bin/python .ci/commit_msg.py MESSAGE_FILE   # exit 1 with the reason on stderr, 0 when the subject is fine
"""

import re
import sys

MAX_SUBJECT = 72
# git's own merge subjects: they name a branch, never what it brings.
BARE_MERGE = re.compile(r"Merge (remote-tracking )?branch(es)? ('[^']+'(, | and )?)+( of \S+)?( into \S+)?")


def problem(message):
    """Why the subject of `message` (a commit message as git hands it to the hook: # lines are comments) is
    refused, or None."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    subject = next((line.strip() for line in lines if line.strip()), "")
    if not subject:
        return "the subject is empty: say what changed"
    if len(subject) > MAX_SUBJECT:
        return (
            f"the subject has {len(subject)} characters, more than {MAX_SUBJECT}: say what changed in the subject, "
            "and why in the body (after a blank line)"
        )
    if BARE_MERGE.fullmatch(subject):
        return (
            f"'{subject}' names a branch, not what it brings: say what it brings, e.g. "
            '"Merge move: one package per lesson"'
        )
    return None


def main(argv):
    with open(argv[1], encoding="utf-8") as f:
        why = problem(f.read())
    if why:
        print(f"commit message refused: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
