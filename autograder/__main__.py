"""python -m autograder COMMAND: a thin face over the stages (`--help` lists the commands)."""
import argparse
import sys

from pathlib import Path

from autograder.checking import LESSONS

WRITTEN_HELP = ("the written questions count (off: shown to students, not counted); their scores are the "
                "--gradebook's manual ones, and a lesson with one not graded yet is 'needs grading' (left blank)")
LIMIT_FLAGS = (("--cell-timeout", "cell_seconds", "s"), ("--call-timeout", "call_seconds", "s"),
               ("--notebook-timeout", "notebook_seconds", "s"), ("--memory", "memory_mb", "MB"))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m autograder", description="The course's instructor commands.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("release", help="write the student copies of the lessons to OUT/<lesson>/")
    r.add_argument("out", metavar="OUT")
    r.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    g = sub.add_parser("grade", help="grade SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb into RESULTS")
    g.add_argument("submissions", metavar="SUBMISSIONS")
    g.add_argument("--out", required=True, metavar="RESULTS", help="where grades.csv and feedback/ go")
    g.add_argument("--lesson", action="append", choices=list(LESSONS),
                   help="only this lesson (repeatable); graded even when nobody submitted it")
    g.add_argument("--all-lessons", action="store_true", help="every lesson, even those nobody submitted")
    g.add_argument("--student", action="append", metavar="S", help="only this student (repeatable)")
    g.add_argument("--jobs", type=int, default=1, metavar="N", help="grade N submissions at once")
    g.add_argument("--resume", action="store_true",
                   help="reuse each stored result whose fingerprint (submission, tests, checks, grader) still matches")
    g.add_argument("--force", action="store_true", help="with --resume: regrade even results that still match")
    g.add_argument("--shard", metavar="i/N", help="grade only the i-th of N slices of the students (0-based)")
    g.add_argument("--manifest", metavar="CLASS_JSON", help="the class list (from `manifest`) that every shard splits")
    g.add_argument("--sandbox", choices=["auto", "bwrap", "uid", "unshare", "none"], default="auto",
                   help="how student code is isolated (default: the strongest that works)")
    g.add_argument("--unsafe", action="store_true", help="allow grading without any sandbox")
    g.add_argument("--gradescope", action="store_true", help="also write gradescope/<student>/results.json")
    g.add_argument("--gradebook", metavar="DB", help="also update this nbgrader gradebook (e.g. gradebook.db)")
    g.add_argument("--course-root", metavar="DIR", help="where --gradebook writes autograded/ (default: its folder)")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    g.add_argument("--written", action="store_true", help=WRITTEN_HELP)
    g.add_argument("--roster", metavar="CSV", help="the class: totals.csv gets a row for every student on it "
                   "(default: the roster collect kept in SUBMISSIONS)")
    for flag, key, unit in LIMIT_FLAGS:
        g.add_argument(flag, type=int, dest=key, metavar=unit.upper(), help=f"limit per {key.split('_')[0]} ({unit})")

    m = sub.add_parser("merge", help="combine the RESULTS folders of sharded runs into one")
    m.add_argument("results", nargs="+", metavar="RESULTS")
    m.add_argument("--out", required=True, metavar="MERGED")
    m.add_argument("--gradescope", action="store_true")
    m.add_argument("--gradebook", metavar="DB")
    m.add_argument("--course-root", metavar="DIR", help="where --gradebook writes autograded/ (default: its folder)")
    m.add_argument("--manifest", metavar="CLASS_JSON", help="check that the shards cover this class list")
    m.add_argument("--allow-partial", action="store_true", help="merge an incomplete shard set, marking the gaps")
    m.add_argument("--roster", metavar="CSV", help="the class: totals.csv gets a row for every student on it")
    m.add_argument("--written", action="store_true", help=WRITTEN_HELP)

    c = sub.add_parser("manifest", help="write the class list (students, lessons) that sharded runs split")
    c.add_argument("submissions", metavar="SUBMISSIONS")
    c.add_argument("--out", required=True, metavar="CLASS_JSON")
    c.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    b = sub.add_parser("gradescope-bundle", help="write a Gradescope autograder zip for one lesson")
    b.add_argument("--lesson", required=True, choices=list(LESSONS), help="the lesson (one per assignment)")
    b.add_argument("--out", required=True, metavar="ZIP")
    for flag, default, what in (("--visibility", "visible", "the submission's score and results"),
                                ("--test-visibility", "visible", "each test's score and message"),
                                ("--stdout-visibility", "hidden", "the grader's log")):
        b.add_argument(flag, default=default, choices=["visible", "hidden", "after_due_date", "after_published"],
                       help=f"when students see {what} (default: {default})")

    co = sub.add_parser("collect", help="turn an LMS download (a folder or zip) into SUBMISSIONS/<student>/<lesson>/")
    co.add_argument("download", metavar="DOWNLOAD")
    co.add_argument("--out", required=True, metavar="SUBMISSIONS")
    co.add_argument("--roster", metavar="CSV", help="student, name, email, lms_id: who is who in the download")
    co.add_argument("--lesson", choices=list(LESSONS), help="the download is this lesson's")
    co.add_argument("--times", action="append", default=[], metavar="CSV",
                    help="submission times: student, lesson, submitted_at; or a Moodle grading worksheet (repeatable)")
    co.add_argument("--timezone", default="UTC", help="the zone of times that name none (default: UTC)")

    x = sub.add_parser("export", help="write RESULTS' scores as a Canvas gradebook import or a plain CSV")
    x.add_argument("results", metavar="RESULTS")
    x.add_argument("--format", required=True, help="canvas or csv")
    x.add_argument("--out", required=True, metavar="FILE")
    x.add_argument("--roster", metavar="CSV", help="student, name, email, lms_id (needed for canvas)")
    x.add_argument("--canvas-gradebook", metavar="CSV", help="a gradebook exported from Canvas: fill its lesson columns")
    x.add_argument("--assignment", action="append", default=[], metavar="LESSON=NAME",
                   help="the Canvas assignment of a lesson, where its name does not say (repeatable)")
    x.add_argument("--deadline", action="append", default=[], metavar="LESSON=ISO8601", help="repeatable")
    x.add_argument("--late-policy", metavar="POLICY", help="e.g. 10%%/day,max=50%% (of the points earned)")
    x.add_argument("--timezone", default="UTC", help="the zone of deadlines that name none (default: UTC)")
    x.add_argument("--submissions", metavar="SUBMISSIONS", help="where collect wrote the submission times")
    x.add_argument("--extensions", metavar="CSV", help="student,lesson,deadline (an ISO 8601 time or 'exempt')")
    x.add_argument("--grace", metavar="DURATION", help="e.g. 15m, 2h or 1d: work this late counts as on time")
    x.add_argument("--gradebook", metavar="DB", help="nbgrader's gradebook: its manual scores and extra credit count "
                   "(default: the one RESULTS was graded with, if any)")
    x.add_argument("--stale-overrides", choices=["keep", "drop"], default="keep",
                   help="a manual score made before its test's autograded result changed: keep it (default) or drop it")
    x.add_argument("--written", action="store_true", help=WRITTEN_HELP)
    x.add_argument("--missing-blank", action="store_true",
                   help="leave a roster student's lesson never handed in blank (and flagged), not 0")

    fu = sub.add_parser("feedback-upload", help="write the zip Canvas or Moodle takes to attach each student's "
                        "feedback page to their submission, one per lesson")
    fu.add_argument("results", metavar="RESULTS")
    fu.add_argument("--submissions", required=True, metavar="SUBMISSIONS", help="where collect wrote collection.csv")
    fu.add_argument("--format", required=True, choices=["canvas", "moodle"], help="the LMS the download came from")
    fu.add_argument("--out", required=True, metavar="FOLDER", help="where <lesson>_feedback_<format>.zip go")
    fu.add_argument("--lesson", action="append", choices=list(LESSONS), help="only this lesson (repeatable)")

    rp = sub.add_parser("report", help="write RESULTS/report.html: pass rates, mistakes, histograms, identical answers")
    rp.add_argument("results", metavar="RESULTS")
    rp.add_argument("--submissions", metavar="SUBMISSIONS", help="the graded notebooks, to find identical answers")
    rp.add_argument("--no-names", action="store_true", help="leave students' names out (for a projector)")
    rp.add_argument("--roster", metavar="CSV", help="student, section: adds each lesson's scores per section")
    rp.add_argument("--gradebook", metavar="DB", help="nbgrader's gradebook: its manual scores count, stale ones "
                    "named (default: the one RESULTS was graded with, if any)")
    rp.add_argument("--written", action="store_true", help="count the written questions even where RESULTS was graded "
                    "and exported without --written (the page says it differs from totals.csv); by default the "
                    "report counts as RESULTS's last grade or export did")

    s = sub.add_parser("sync", help="rewrite the notebooks' solution and hidden-test cells from solutions/")
    s.add_argument("--lesson", action="append", choices=list(LESSONS))
    s.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of date")

    from autograder.audit import EXIT_STATUS
    au = sub.add_parser("audit", help="run every known mistake and variant against a lesson's visible and hidden tests",
                        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    elif args.command in ("collect", "export", "report"):
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
            from autograder import lessons, notebook as nbk
            try:
                ids = {nbk.grade_id(c) for c in nbk.code_cells(nbk.read(args.notebook)) if nbk.is_answer(c)}
            except (nbk.NotebookError, OSError, ValueError) as e:
                print(f"error: --notebook {args.notebook}: {e}", file=sys.stderr)
                return 2
            missing = [name for name in lessons.points(args.lesson) if name not in ids]
            if missing:
                print(f"error: --notebook {args.notebook} has no answer cell for {', '.join(missing)} of "
                      f"{args.lesson} (another lesson's notebook?)", file=sys.stderr)
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
        print("interrupted by SIGINT: finished results are kept; run the same command with --resume",
              file=sys.stderr)
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


def _outputs(args):
    """The adapters' writers that follow grade's and merge's reports; UsageError, before any work,
    for a --gradebook that could not be written."""
    from autograder.adapters import report_outputs
    from autograder.adapters.export import counting_of
    from autograder.adapters.gradebook import check_gradebook, check_same_gradebook
    from autograder.adapters.roster import kept_roster, load_roster, stored_roster

    check_gradebook(args.gradebook)
    check_same_gradebook(args.out, args.gradebook)
    counting_of(args.out)   # a damaged record of how RESULTS is counted stops the run before any work
    roster = load_roster(args.roster) if getattr(args, "roster", None) else \
        stored_roster(getattr(args, "submissions", None)) or kept_roster(args.out)   # collect's, else RESULTS's
    return report_outputs(args.gradebook, args.course_root, roster, args.written)


def _merge(args):
    from autograder.merge import merge

    results = merge(args.results, args.out, args.gradescope, _outputs(args), args.manifest, args.allow_partial,
                    args.written)
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
        print("note: --force matters only with --resume; without it every selected submission is regraded",
              file=sys.stderr)
    mode = choose_mode(args.sandbox, args.unsafe)
    limits = {k: getattr(args, k) for _, k, _ in LIMIT_FLAGS if getattr(args, k) is not None}
    run = grade(args.submissions, args.out, args.lesson, args.jobs, args.resume, shard, mode, limits,
                args.gradescope, _outputs(args), progress=not args.quiet, all_lessons=args.all_lessons,
                students=args.student, force=args.force, manifest=args.manifest, written=args.written)
    why = ", ".join(f"{n} {reason}" for reason, n in run["reasons"].most_common())
    print(f"graded {run['graded']} submission(s) of {', '.join(run['lessons'])}"
          + (f" ({why})" if args.resume and why else "") + (f"; reused {run['reused']} unchanged" if args.resume else ""),
          file=sys.stderr)
    if run["anomalies"]:
        print(f"anomalies ({sum(int(line.split(' x ')[0]) for line in run['anomalies'])}):", file=sys.stderr)
        for line in run["anomalies"]:
            print(line, file=sys.stderr)
    _summary(args.out, run["results"])
    return 0


def _term(args):
    """collect, export and report (collect.py, export.py, classreport.py)."""
    from autograder.results import UsageError, load_term
    from autograder.adapters.roster import kept_roster, load_roster, stored_roster

    try:
        roster = load_roster(args.roster) if getattr(args, "roster", None) else None
        if roster is None and args.command != "collect":   # the roster collect kept, else the one RESULTS kept
            roster = stored_roster(getattr(args, "submissions", None)) or kept_roster(args.results)
        if args.command == "collect":
            from autograder.adapters.collect import collect
            collect(args.download, args.out, roster, args.lesson, args.times, args.timezone)
            return 0
        term = load_term(args.results)  # a refused result is named and marked, never a silent blank: exit 1
        for line in term.lines:
            print(f"error: {line}", file=sys.stderr)
        results, refused = term.results, term.refused
        if not results and not refused:
            raise UsageError(f"{args.results} holds no grading results (grade into it first)")
        if args.command == "report":
            from dataclasses import replace
            from autograder.adapters.classreport import submission_mismatches
            from autograder.adapters.export import counting_of
            stale = submission_mismatches(results, args.submissions)
            for line in stale:
                print(f"error: {line}", file=sys.stderr)
            counting, apart = counting_of(args.results), []
            if args.written and not counting.written:   # what the instructor asked for, said to differ from totals.csv
                counting = replace(counting, written=True)
                apart.append(f"the written questions count here, but not in {args.results}/totals.csv or the export: "
                             "grade or export with --written to count them there too")
                print(f"warning: {apart[0]}", file=sys.stderr)
            path = _class_report(args, results, refused, roster, term.lines + stale + apart,
                                 _reviews(args.gradebook, args.results), counting, not args.no_names)
            print(f"wrote {path}")
            return 1 if refused or stale else 0
        from autograder.adapters.export import counting_of, export
        reviews = _reviews(args.gradebook, args.results)
        for line in export(args.results, results, args.format, args.out, roster, args.canvas_gradebook,
                           args.deadline, args.late_policy, args.timezone, args.submissions, args.assignment,
                           refused, args.extensions, args.grace, args.missing_blank,
                           reviews, args.stale_overrides, args.written):
            print(f"warning: {line}", file=sys.stderr)
        # The class report counts as the export now does, as totals.csv and the feedback pages it rewrote.
        report_path = _class_report(args, results, refused, roster, term.lines, reviews, counting_of(args.results))
        print(f"wrote {args.out} and {report_path}")
        return 1 if refused else 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _class_report(args, results, refused, roster, warnings, reviews, counting, names=True):
    """RESULTS/report.html (classreport.write_report) of report and export: the results, each refused one as a
    placeholder naming why, the roster's students and sections. Returns its path."""
    from autograder import report
    from autograder.adapters.classreport import write_report
    results = results + [report.placeholder(s, lsn, "not graded: " + report.refused_message(why))
                         for (s, lsn), why in sorted(refused.items()) if lsn in LESSONS]
    sections = {r["student"]: r["section"] for r in roster.rows} if roster and "section" in roster.columns else None
    return write_report(args.results, results, args.submissions, warnings, names, sections,
                        [r["student"] for r in roster.rows] if roster else None, reviews, counting)


def _reviews(gradebook, out):
    """The manual scores (gradebook.read_reviews) of --gradebook or, without it, of the gradebook RESULTS (out) was
    graded with (the same scores as its totals.csv and feedback pages); None when there is neither."""
    from autograder.adapters.gradebook import check_gradebook, read_reviews, remembered_gradebook
    gradebook = gradebook or remembered_gradebook(out)
    if not gradebook:
        return None
    check_gradebook(gradebook)
    return read_reviews(gradebook)


def _summary(out, results):
    """The run's last line: its points are totals.csv's (the export's counting: manual scores, written questions,
    roster students who never submitted), summed, so the two never disagree."""
    from autograder.results import read_csv

    rows = read_csv(Path(out) / "totals.csv")
    got, full = (sum(float(r[c] or 0) for r in rows) for c in ("total", "max_points"))
    waiting = sum(v in ("needs grading", "") for r in rows for k, v in r.items()
                  if k not in ("student", "total", "max_points", "percentage", "regrade", "flags"))
    students = len({r.student for r in results})
    print(f"{out} holds {len(results)} results ({students} students"
          + (f"; {len(rows)} in totals.csv with the roster" if len(rows) != students else "")
          + f"), {got:g}/{full:g} points in totals.csv"
          + (f" ({waiting} lesson scores left out: still to grade, or to grade again)" if waiting else "")
          + f"; wrote {out}/grades.csv, totals.csv, report.html and feedback/")
    if any(r.grader_errors for r in results):
        print(f"the grader itself failed on some tests (status error): see {out}/grader-errors.log", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
