"""python -m autograder COMMAND: a thin face over the stages (`--help` lists the commands)."""

import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from autograder.lessons import solutions_modules

LESSONS = (
    solutions_modules()
)  # {lesson: its module}, from the manifests: no torch to load for a command that needs none

WRITTEN_HELP = (
    "the written questions count (off: shown to students, not counted); their scores are the "
    "--gradebook's manual ones, and a lesson with one not graded yet is 'needs grading' (left blank)"
)
LIMIT_FLAGS = (
    ("--cell-timeout", "cell_seconds", "s"),
    ("--call-timeout", "call_seconds", "s"),
    ("--notebook-timeout", "notebook_seconds", "s"),
    ("--memory", "memory_mb", "MB"),
)


def rule_flags():
    """The flags of the counting rule (config.RuleFlags), one declaration for every command that takes them:
    `rule` sets RESULTS's rule with them; grade, merge and report refuse them where they disagree with it; export
    counts a trial with them."""
    f = argparse.ArgumentParser(add_help=False)
    g = f.add_argument_group("the counting rule (RESULTS keeps it: `rule` sets it, other commands must agree)")
    g.add_argument("--written", action=argparse.BooleanOptionalAction, default=None, help=WRITTEN_HELP)
    g.add_argument(
        "--missing-blank",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="leave a lesson never handed in blank (and flagged), not 0",
    )
    g.add_argument(
        "--stale-overrides",
        choices=["keep", "drop"],
        default=None,
        help="a manual score made before its test's autograded result changed: keep it or drop it",
    )
    g.add_argument("--deadline", action="append", default=[], metavar="LESSON=ISO8601", help="repeatable")
    g.add_argument("--late-policy", metavar="POLICY", help="e.g. 10%%/day,max=50%% (of the points earned), or none")
    g.add_argument("--timezone", default="UTC", help="the zone of deadlines that name none (default: UTC)")
    g.add_argument("--extensions", metavar="CSV", help="student,lesson,deadline (an ISO 8601 time or 'exempt')")
    g.add_argument("--grace", metavar="DURATION", help="e.g. 15m, 2h or 1d: work this late counts as on time")
    g.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="go on although a file names a student or lesson "
        "RESULTS and the roster do not know, or a Canvas maximum differs (each is an error otherwise)",
    )
    return f


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m autograder", description="The course's instructor commands.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rules = rule_flags()

    r = sub.add_parser("release", help="write the student copies of the lessons to OUT/<lesson>/")
    r.add_argument("out", metavar="OUT")
    r.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    g = sub.add_parser(
        "grade", help="grade SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb into RESULTS", parents=[rules]
    )
    g.add_argument("submissions", metavar="SUBMISSIONS")
    g.add_argument("--out", required=True, metavar="RESULTS", help="where grades.csv and feedback/ go")
    g.add_argument(
        "--lesson",
        action="append",
        choices=list(LESSONS),
        help="only this lesson (repeatable); graded even when nobody submitted it",
    )
    g.add_argument("--all-lessons", action="store_true", help="every lesson, even those nobody submitted")
    g.add_argument("--student", action="append", metavar="S", help="only this student (repeatable)")
    g.add_argument("--jobs", type=int, default=1, metavar="N", help="grade N submissions at once")
    g.add_argument(
        "--resume",
        action="store_true",
        help="reuse each stored result whose fingerprint (submission, tests, checks, grader) still matches",
    )
    g.add_argument("--force", action="store_true", help="with --resume: regrade even results that still match")
    g.add_argument("--shard", metavar="i/N", help="grade only the i-th of N slices of the students (0-based)")
    g.add_argument("--manifest", metavar="CLASS_JSON", help="the class list (from `manifest`) that every shard splits")
    g.add_argument(
        "--sandbox",
        choices=["auto", "bwrap", "uid", "unshare", "none"],
        default="auto",
        help="how student code is isolated (default: the strongest that works)",
    )
    g.add_argument("--unsafe", action="store_true", help="allow grading without any sandbox")
    g.add_argument("--gradescope", action="store_true", help="also write gradescope/<student>/results.json")
    g.add_argument("--gradebook", metavar="DB", help="also update this nbgrader gradebook (e.g. gradebook.db)")
    g.add_argument("--course-root", metavar="DIR", help="where --gradebook writes autograded/ (default: its folder)")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    # Two flags, not one with an optional value: `grade --kernels SUBMISSIONS` must keep reading the folder.
    g.add_argument(
        "--kernels",
        action="store_const",
        const="note",
        default="",
        help="also compile each submission's Triton kernels (lesson 06's) for a GPU, an A100, in its sandbox, "
        "and say in its feedback whether they compile and fit: a note, not graded",
    )
    g.add_argument(
        "--kernels-graded",
        dest="kernels",
        action="store_const",
        const="graded",
        help="as --kernels, and make it an aspect of the test of the function that launches each kernel",
    )
    g.add_argument(
        "--roster",
        metavar="CSV",
        help="the class: totals.csv gets a row for every student on it "
        "(default: the roster collect kept in SUBMISSIONS)",
    )
    for flag, key, unit in LIMIT_FLAGS:
        g.add_argument(flag, type=int, dest=key, metavar=unit.upper(), help=f"limit per {key.split('_')[0]} ({unit})")

    m = sub.add_parser("merge", help="combine the RESULTS folders of sharded runs into one", parents=[rules])
    m.add_argument("results", nargs="+", metavar="RESULTS")
    m.add_argument("--out", required=True, metavar="MERGED")
    m.add_argument("--gradescope", action="store_true")
    m.add_argument("--gradebook", metavar="DB")
    m.add_argument("--course-root", metavar="DIR", help="where --gradebook writes autograded/ (default: its folder)")
    m.add_argument("--manifest", metavar="CLASS_JSON", help="check that the shards cover this class list")
    m.add_argument("--allow-partial", action="store_true", help="merge an incomplete shard set, marking the gaps")
    m.add_argument("--roster", metavar="CSV", help="the class: totals.csv gets a row for every student on it")

    c = sub.add_parser("manifest", help="write the class list (students, lessons) that sharded runs split")
    c.add_argument("submissions", metavar="SUBMISSIONS")
    c.add_argument("--out", required=True, metavar="CLASS_JSON")
    c.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    b = sub.add_parser("gradescope-bundle", help="write a Gradescope autograder zip for one lesson")
    b.add_argument("--lesson", required=True, choices=list(LESSONS), help="the lesson (one per assignment)")
    b.add_argument("--out", required=True, metavar="ZIP")
    for flag, default, what in (
        ("--visibility", "visible", "the submission's score and results"),
        ("--test-visibility", "visible", "each test's score and message"),
        ("--stdout-visibility", "hidden", "the grader's log"),
    ):
        b.add_argument(
            flag,
            default=default,
            choices=["visible", "hidden", "after_due_date", "after_published"],
            help=f"when students see {what} (default: {default})",
        )

    co = sub.add_parser("collect", help="turn an LMS download (a folder or zip) into SUBMISSIONS/<student>/<lesson>/")
    co.add_argument("download", metavar="DOWNLOAD")
    co.add_argument("--out", required=True, metavar="SUBMISSIONS")
    co.add_argument("--roster", metavar="CSV", help="student, name, email, lms_id: who is who in the download")
    co.add_argument("--lesson", choices=list(LESSONS), help="the download is this lesson's")
    co.add_argument(
        "--times",
        action="append",
        default=[],
        metavar="CSV",
        help="submission times: student, lesson, submitted_at; or a Moodle grading worksheet (repeatable)",
    )
    co.add_argument("--timezone", default="UTC", help="the zone of times that name none (default: UTC)")
    co.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="collect although a --times line names a student or lesson the roster and course lack",
    )

    ru = sub.add_parser(
        "rule",
        parents=[rules],
        help="set or change how RESULTS counts (written questions, deadlines, "
        "late policy, grace, extensions, a lesson never handed in, stale overrides); says what changed",
    )
    ru.add_argument("results", metavar="RESULTS")
    ru.add_argument("--roster", metavar="CSV", help="the class (default: the roster RESULTS or SUBMISSIONS keeps)")
    ru.add_argument("--submissions", metavar="SUBMISSIONS", help="where collect wrote the submission times")
    ru.add_argument("--gradebook", metavar="DB", help="nbgrader's gradebook (default: the one RESULTS was graded with)")

    x = sub.add_parser(
        "export",
        parents=[rules],
        help="write RESULTS' scores as a Canvas gradebook import or a plain "
        "CSV; flags of another rule than RESULTS's make a trial that writes only --out",
    )
    x.add_argument("results", metavar="RESULTS")
    x.add_argument("--format", required=True, help="canvas or csv")
    x.add_argument("--out", required=True, metavar="FILE")
    x.add_argument("--roster", metavar="CSV", help="student, name, email, lms_id (needed for canvas)")
    x.add_argument(
        "--canvas-gradebook", metavar="CSV", help="a gradebook exported from Canvas: fill its lesson columns"
    )
    x.add_argument(
        "--assignment",
        action="append",
        default=[],
        metavar="LESSON=NAME",
        help="the Canvas assignment of a lesson, where its name does not say (repeatable)",
    )
    x.add_argument("--submissions", metavar="SUBMISSIONS", help="where collect wrote the submission times")
    x.add_argument(
        "--gradebook",
        metavar="DB",
        help="nbgrader's gradebook: its manual scores and extra credit count "
        "(default: the one RESULTS was graded with, if any)",
    )

    fu = sub.add_parser(
        "feedback-upload",
        help="write the zip Canvas or Moodle takes to attach each student's "
        "feedback page to their submission, one per lesson",
    )
    fu.add_argument("results", metavar="RESULTS")
    fu.add_argument("--submissions", required=True, metavar="SUBMISSIONS", help="where collect wrote collection.csv")
    fu.add_argument("--format", required=True, choices=["canvas", "moodle"], help="the LMS the download came from")
    fu.add_argument("--out", required=True, metavar="FOLDER", help="where <lesson>_feedback_<format>.zip go")
    fu.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    rp = sub.add_parser(
        "report", parents=[rules], help="write RESULTS/report.html: pass rates, mistakes, histograms, identical answers"
    )
    rp.add_argument("results", metavar="RESULTS")
    rp.add_argument("--submissions", metavar="SUBMISSIONS", help="the graded notebooks, to find identical answers")
    rp.add_argument("--no-names", action="store_true", help="leave students' names out (for a projector)")
    rp.add_argument("--roster", metavar="CSV", help="student, section: adds each lesson's scores per section")
    rp.add_argument(
        "--gradebook",
        metavar="DB",
        help="nbgrader's gradebook: its manual scores count, stale ones "
        "named (default: the one RESULTS was graded with, if any)",
    )

    s = sub.add_parser("sync", help="rewrite the notebooks' solution and hidden-test cells from solutions/")
    s.add_argument("--lesson", action="append", choices=list(LESSONS))
    s.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of date")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["audit"]:  # audit loads the checks (torch): only for its own help, never for grade's start
        from autograder.audit import EXIT_STATUS
    au = sub.add_parser(
        "audit",
        help="run every known mistake and variant against a lesson's visible and hidden tests",
        epilog=EXIT_STATUS if argv[:1] == ["audit"] else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    au.add_argument("lesson", choices=list(LESSONS), metavar="LESSON")
    au.add_argument("--notebook", metavar="NB", help="an edited source notebook of the lesson (default: the lesson's)")

    args = p.parse_args(argv)
    if args.command == "release":
        from autograder.release import release

        try:
            for path in release(args.out, args.lesson):
                print(path)
        except OSError as e:
            print(f"error: cannot write the student copies to {args.out}: {e.strerror or e}", file=sys.stderr)
            return 2
    elif args.command in ("grade", "merge", "manifest"):
        return _grade_or_merge(args)
    elif args.command in ("collect", "export", "report", "rule"):
        return _term(args)
    elif args.command == "feedback-upload":
        from autograder.adapters.feedback_upload import feedback_upload
        from autograder.results import UsageError

        try:
            zips, lines = feedback_upload(args.results, args.submissions, args.format, args.out, args.lesson)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for line in lines:
            print(f"warning: {line}", file=sys.stderr)
        for path in zips:
            print(f"wrote {path}")
    elif args.command == "gradescope-bundle":
        from autograder.adapters.gradescope import bundle
        from autograder.results import UsageError

        try:
            print(bundle(args.lesson, args.out, args.visibility, args.test_visibility, args.stdout_visibility))
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    elif args.command == "audit":
        from autograder.audit import audit

        if args.notebook and not Path(args.notebook).is_file():
            print(f"error: --notebook {args.notebook}: no such file", file=sys.stderr)
            return 2
        if args.notebook:  # another lesson's notebook, or one without an answer cell, is named, not a traceback
            from autograder import lessons
            from autograder import notebook as nbk

            try:
                ids = {nbk.grade_id(c) for c in nbk.code_cells(nbk.read(args.notebook)) if nbk.is_answer(c)}
            except (nbk.NotebookError, OSError, ValueError) as e:
                print(f"error: --notebook {args.notebook}: {e}", file=sys.stderr)
                return 2
            missing = [name for name in lessons.points(args.lesson) if name not in ids]
            if missing:
                print(
                    f"error: --notebook {args.notebook} has no answer cell for {', '.join(missing)} of "
                    f"{args.lesson} (another lesson's notebook?)",
                    file=sys.stderr,
                )
                return 2
        return audit(args.lesson, args.notebook)
    elif args.command == "sync":
        from autograder.sync import sync

        changed = sync(args.lesson, check=args.check)
        for line in changed:
            print(("out of date: " if args.check else "synced: ") + line)
        return 1 if changed and args.check else 0
    return 0


def _grade_or_merge(args):
    from autograder.grade import Interrupted
    from autograder.results import UsageError
    from autograder.worker import SandboxError

    try:
        return {"grade": _grade, "merge": _merge, "manifest": _manifest}[args.command](args)
    except (UsageError, SandboxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(e, file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # before or after the grading itself: nothing half-written
        print("interrupted by SIGINT: finished results are kept; run the same command with --resume", file=sys.stderr)
        return 130


def _manifest(args):
    from autograder.grade import plan
    from autograder.results import UsageError, write_manifest

    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise UsageError(f"--out {out}: name a file (e.g. class.json) in a folder that exists")
    klass, lessons, *_ = plan(args.submissions, None, args.lesson)
    write_manifest(args.out, klass, lessons)
    print(f"wrote {args.out}: {len(klass)} students, lessons {', '.join(lessons)}")
    return 0


def _flags(args):
    """The counting rule's flags a command was given (config.RuleFlags)."""
    from autograder.config import RuleFlags

    return RuleFlags(
        args.written,
        args.missing_blank,
        None if args.stale_overrides is None else args.stale_overrides == "drop",
        tuple(args.deadline),
        args.late_policy,
        args.extensions,
        args.grace,
        args.timezone,
        getattr(args, "submissions", None),
    )


def _stored_rule(args, out, students=None):
    """RESULTS's (out) counting rule, which this command counts by; UsageError, one line, when the command's flags
    disagree with it. A folder that records none yet takes the flags' (its first grade or merge records it)."""
    from autograder.config import read_settings, settings_path

    flags, stored = _flags(args), read_settings(out).rule
    if not settings_path(out).is_file():
        return flags.rule_over(stored, list(LESSONS), students, args.allow_mismatch)
    flags.refuse(out, stored, list(LESSONS), students, args.allow_mismatch)
    return flags.rule_over(stored, list(LESSONS), students, args.allow_mismatch)  # its submissions, if given


def _config(args, **grading):
    """The run's RunConfig from grade's or merge's flags (RESULTS is --out): its roster (--roster, else the one collect
    kept in SUBMISSIONS, else RESULTS's), RESULTS's rule; UsageError, before any work, for a --gradebook that could not
    be written or flags that disagree with RESULTS's rule."""
    from autograder.adapters.gradebook import check_gradebook, check_same_gradebook
    from autograder.adapters.roster import kept_roster, load_roster, stored_roster
    from autograder.config import RunConfig

    check_gradebook(args.gradebook)
    check_same_gradebook(args.out, args.gradebook)
    submissions = getattr(args, "submissions", None)
    roster = load_roster(args.roster) if args.roster else stored_roster(submissions) or kept_roster(args.out)
    students = _class(roster, args.out, submissions, getattr(args, "results", ()), args.manifest)
    return RunConfig(
        Path(args.out),
        submissions and Path(submissions),
        roster,
        args.gradebook,
        args.course_root,
        _stored_rule(args, args.out, students),
        args.allow_mismatch,
        gradescope=args.gradescope,
        **grading,
    )


def _class(roster, out, submissions=None, merged=(), manifest=None) -> set:
    """The students a file given to grade or merge may name (an extension): the roster's, the manifest's, SUBMISSIONS's
    student folders and those RESULTS (out) and the folders merged into it hold results of. A folder with no results
    yet still knows its class, so a typo is refused there too."""
    from autograder.results import check_student, read_manifest, stored_pairs

    names = {r["student"] for r in (roster.rows if roster else ())}
    names |= set(read_manifest(manifest)["students"]) if manifest else set()
    names |= {s for folder in (out, *merged) if Path(folder).is_dir() for s, _ in stored_pairs(folder)}
    try:
        with os.scandir(submissions) if submissions else nullcontext(()) as entries:  # merge has none
            names |= {e.name for e in entries if e.is_dir(follow_symlinks=False) and not check_student(e.name)}
    except OSError:  # unreadable: grade says so in its own words
        pass
    return names


def _outputs(config):
    from autograder.adapters import report_outputs

    return report_outputs(config.gradebook, config.course_root, config.roster, config.rule)


def _merge(args):
    from autograder.merge import merge

    config = _config(args, manifest=args.manifest, allow_partial=args.allow_partial)
    results = merge(config, args.results, _outputs(config))
    _summary(args.out, results)
    return 0


def _grade(args):
    from autograder.grade import GradeError, grade, parse_shard
    from autograder.worker import choose_mode

    if args.jobs < 1:
        raise GradeError("--jobs must be at least 1")
    bad = next((f for f, k, _ in LIMIT_FLAGS if getattr(args, k) is not None and getattr(args, k) < 1), None)
    if bad:
        raise GradeError(f"{bad} must be a positive number")
    shard = parse_shard(args.shard) if args.shard else None
    if args.force and not args.resume:
        print(
            "note: --force matters only with --resume; without it every selected submission is regraded",
            file=sys.stderr,
        )
    config = _config(
        args,
        lessons=args.lesson and tuple(args.lesson),
        all_lessons=args.all_lessons,
        students=args.student and tuple(args.student),
        shard=shard,
        manifest=args.manifest,
        jobs=args.jobs,
        resume=args.resume,
        force=args.force,
        mode=choose_mode(args.sandbox, args.unsafe),
        limits={k: getattr(args, k) for _, k, _ in LIMIT_FLAGS if getattr(args, k) is not None} or None,
        progress=not args.quiet,
        kernels=args.kernels,
    )
    run = grade(config, _outputs(config))
    why = ", ".join(f"{n} {reason}" for reason, n in run["reasons"].most_common())
    print(
        f"graded {run['graded']} submission(s) of {', '.join(run['lessons'])}"
        + (f" ({why})" if args.resume and why else "")
        + (f"; reused {run['reused']} unchanged" if args.resume else ""),
        file=sys.stderr,
    )
    if run["anomalies"]:
        print(f"anomalies ({sum(int(line.split(' x ')[0]) for line in run['anomalies'])}):", file=sys.stderr)
        for line in run["anomalies"]:
            print(line, file=sys.stderr)
    _summary(args.out, run["results"])
    return 0


def _term(args):
    """collect, export, report and rule (collect.py, export.py, classreport.py, config.py)."""
    from autograder.adapters.roster import kept_roster, load_roster, stored_roster
    from autograder.results import UsageError

    try:
        roster = load_roster(args.roster) if getattr(args, "roster", None) else None
        if roster is None and args.command != "collect":  # the roster collect kept, else the one RESULTS kept
            roster = stored_roster(getattr(args, "submissions", None)) or kept_roster(args.results)
        if args.command == "collect":
            from autograder.adapters.collect import collect

            collect(args.download, args.out, roster, args.lesson, args.times, args.timezone, args.allow_mismatch)
            return 0
        return {"export": _export, "report": _report, "rule": _rule}[args.command](args, roster)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _load(args, roster):
    """(Term, the students a file may name: the roster's and the results', reviews) of RESULTS; UsageError, before
    anything is written, when its key is not the one it was graded with (every result would be refused), or a
    gradebook's manual score names a student, lesson or test RESULTS does not know (unless --allow-mismatch). The
    refused results are said in one line per cause (Term.lines, for the report too)."""
    from autograder import results as store
    from autograder.counting import grouped
    from autograder.results import UsageError

    out = args.results
    if store.stored_pairs(out) and (why := store.folder_problem(out)):
        raise UsageError(f"{out}: {why}")
    term = store.load_term(out)
    if not term.results and not term.refused:
        raise UsageError(f"{out} holds no grading results (grade into it first)")
    term.lines = grouped(
        "stored result refused, left blank (regrade it: grade --resume)",
        [(s, lsn, why) for (s, lsn), why in term.refused.items()],
    )
    for line in term.lines:
        print(f"error: {line}", file=sys.stderr)
    students = (
        {r.student for r in term.results}
        | {s for s, _ in term.refused}
        | {r["student"] for r in (roster.rows if roster else ())}
    )
    reviews = _reviews(args.gradebook, out, term.results, students, args.allow_mismatch)
    return term, students, reviews


def _term_config(args, roster, rule, **more):
    """The RunConfig of export, report or rule, from their flags: RESULTS (their first argument), --submissions,
    the roster (_term's), --gradebook and --allow-mismatch; rule: the counting rule the command counts by."""
    from autograder.config import RunConfig

    return RunConfig(
        Path(args.results),
        args.submissions and Path(args.submissions),
        roster,
        args.gradebook,
        rule=rule,
        allow_mismatch=args.allow_mismatch,
        **more,
    )


def _export(args, roster):
    from autograder.adapters.export import export
    from autograder.config import read_settings

    term, students, reviews = _load(args, roster)
    stored = read_settings(args.results).rule
    rule = _flags(args).rule_over(stored, list(LESSONS), students, args.allow_mismatch)
    trial = rule.changes(stored, f"{args.results}: ")
    config = _term_config(args, roster, rule)
    warnings = export(
        config,
        term.results,
        args.format,
        args.out,
        bool(trial),
        args.canvas_gradebook,
        args.assignment,
        term.refused,
        reviews,
    )
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if trial:
        print(
            f"note: a trial, counted otherwise than {args.results}'s rule ({'; '.join(trial)}): wrote only "
            f"{args.out}; {args.results}'s totals.csv, feedback pages and report are unchanged (`python -m "
            f"autograder rule {args.results} ...` makes a rule RESULTS's)",
            file=sys.stderr,
        )
        return 1 if term.refused else 0
    report_path = _class_report(config, term, term.lines, reviews)
    print(f"wrote {args.out}, {args.results}/totals.csv, feedback/ and {report_path}")
    return 1 if term.refused else 0


def _report(args, roster):
    from autograder.adapters.classreport import submission_mismatches

    term, students, reviews = _load(args, roster)
    config = _term_config(args, roster, _stored_rule(args, args.results, students), names=not args.no_names)
    stale = submission_mismatches(term.results, config.submissions)
    for line in stale:
        print(f"error: {line}", file=sys.stderr)
    path = _class_report(config, term, term.lines + stale, reviews)
    print(f"wrote {path}")
    return 1 if term.refused or stale else 0


def _rule(args, roster):
    """Set RESULTS's counting rule from the flags, say what changed, and count its totals.csv, feedback pages
    and report by it."""
    from autograder.config import read_settings, set_rule
    from autograder.counting import write_final

    term, students, reviews = _load(args, roster)
    rule = _flags(args).rule_over(read_settings(args.results).rule, list(LESSONS), students, args.allow_mismatch)
    changed = set_rule(args.results, rule)
    # Everything counted by the new rule is written before a word is printed: output cut off (a closed pipe)
    # never leaves the rule saved and totals.csv counted by the old one.
    write_final(args.results, term.results, term.refused, roster, reviews, rule)
    path = _class_report(_term_config(args, roster, rule), term, term.lines, reviews)
    for line in changed:
        print(f"changed: {line}")
    print(f"{args.results} counts: {rule.said()}" + ("" if changed else " (unchanged)"))
    print(f"wrote {args.results}/totals.csv, feedback/ and {path}")
    return 1 if term.refused else 0


def _class_report(config, term, warnings, reviews):
    """RESULTS/report.html (classreport.write_report) of report, export and rule, by their RunConfig: the term's
    results, each refused one as a placeholder naming why. Returns its path."""
    from autograder import report
    from autograder.adapters.classreport import write_report

    results = term.results + [
        report.placeholder(s, lsn, "not graded: " + report.refused_message(why))
        for (s, lsn), why in sorted(term.refused.items())
        if lsn in LESSONS
    ]
    return write_report(config, results, warnings, reviews)


def _reviews(gradebook, out, results=(), students=(), allow_mismatch=False):
    """The manual scores (gradebook.read_reviews) of --gradebook or, without it, of the gradebook RESULTS (out) was
    graded with (the same scores as its totals.csv and feedback pages); None when there is neither. UsageError
    when one names a student, lesson or test RESULTS does not know (unless allow_mismatch): it would count nowhere."""
    from autograder.adapters.gradebook import check_gradebook, read_reviews, remembered_gradebook
    from autograder.results import UsageError

    gradebook = gradebook or remembered_gradebook(out)
    if not gradebook:
        return None
    check_gradebook(gradebook)
    reviews = read_reviews(gradebook)
    known = {(r.student, r.lesson): {t.test for t in r.tests} | {w.question for w in r.written} for r in results}
    for (student, lesson), review in sorted(reviews.items()):
        tests = set(review.manual) | set(review.extra)
        unknown = (
            f"student {student!r}"
            if student not in students
            else f"lesson {lesson!r}"
            if lesson not in LESSONS
            else f"{lesson} {', '.join(sorted(tests - known[student, lesson]))}"
            if (student, lesson) in known and tests - known[student, lesson]
            else None
        )
        if unknown and tests and not allow_mismatch:
            raise UsageError(
                f"the gradebook {gradebook} has a manual score for {unknown}, which {out} does not know "
                f"({student} {lesson}): fix it in formgrader, or pass --allow-mismatch to go on without it"
            )
    return reviews


def _summary(out, results):
    """The run's last line: its points are totals.csv's (the export's counting: manual scores, written questions,
    roster students who never submitted), summed, so the two never disagree."""
    from autograder.results import read_csv

    rows = read_csv(Path(out) / "totals.csv")
    got, full = (sum(float(r[c] or 0) for r in rows) for c in ("total", "max_points"))
    waiting = sum(
        v in ("needs grading", "")
        for r in rows
        for k, v in r.items()
        if k not in ("student", "total", "max_points", "percentage", "regrade", "flags")
    )
    students = len({r.student for r in results})
    print(
        f"{out} holds {len(results)} results ({students} students"
        + (f"; {len(rows)} in totals.csv with the roster" if len(rows) != students else "")
        + f"), {got:g}/{full:g} points in totals.csv"
        + (f" ({waiting} lesson scores left out: still to grade, or to grade again)" if waiting else "")
        + f"; wrote {out}/grades.csv, totals.csv, report.html and feedback/"
    )
    if any(r.grader_errors for r in results):
        print(f"the grader itself failed on some tests (status error): see {out}/grader-errors.log", file=sys.stderr)


if __name__ == "__main__":
    status = main()
    # Every file is written and closed by now: the interpreter's own teardown of what grade imported (torch's
    # modules) would only add about half a second to every run, a regrade of one notebook included.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
