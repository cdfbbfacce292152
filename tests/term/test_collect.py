"""`python -m autograder collect`: LMS downloads (Canvas, Moodle, nbgrader, plain folders; folders and
zips) built here file by file, into SUBMISSIONS/<student>/<lesson>/<lesson>.ipynb, with every anomaly
reported and unsafe archives refused."""

import copy
import csv
import io
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.__main__ import main
from autograder.adapters import collect as col
from autograder.adapters.roster import load_roster
from autograder.results import read_csv, read_timestamp

ROSTER = """student,name,email,lms_id
alice,"Liddell, Alice",alice@example.org,101
bob,Bob Stone,bob@example.org,102
carol,Carol Danvers,carol@example.org,103
dave,Dave Bowman,dave@example.org,104
erin,Erin Brockovich,erin@example.org,105
frank,Frank Poole,frank@example.org,106
grace,"Hopper, Grace",grace@example.org,777
"""


def notebook(lesson, variant=0, metadata=True):
    """A submission of `lesson` (its source notebook; variant makes different bytes)."""
    nb = copy.deepcopy(nbk.read(nbk.lesson_path(lesson)))
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": f"variant {variant}"})
    if not metadata:
        for cell in nb["cells"]:
            cell["metadata"].pop("nbgrader", None)
    return json.dumps(nb).encode()


def put(root, rel, data):
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def zip_folder(folder, dest):
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(folder).as_posix())
    return dest


def log_rows(out):
    return read_csv(Path(out) / "collection.csv")


def anomalies(out):
    """{file: set of anomaly kinds} from collection.csv."""
    return {r["file"]: set(filter(None, r["anomaly"].split("; "))) for r in log_rows(out)}


@pytest.fixture
def roster(tmp_path):
    return put(tmp_path, "roster.csv", ROSTER.encode())


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
def test_canvas_download(tmp_path, roster, capsys, as_zip):
    dl = tmp_path / "canvas"
    put(dl, "liddellalice_101_9001_01_attention.ipynb", notebook("01_attention", 0))
    put(dl, "liddellalice_101_9001_01_attention-1.ipynb", notebook("01_attention", 1))
    latest = put(dl, "liddellalice_101_9001_01_attention-2.ipynb", notebook("01_attention", 2))
    put(dl, "stonebob_late_102_9002_01_attention.ipynb", notebook("01_attention", 3))
    os.utime(latest, (1_000_000_000, 1_000_000_000))  # an mtime is never a submission time
    source = zip_folder(dl, tmp_path / "submissions.zip") if as_zip else dl
    out = tmp_path / "SUBMISSIONS"

    assert main(["collect", str(source), "--out", str(out), "--roster", str(roster), "--lesson", "01_attention"]) == 0
    said = capsys.readouterr().out
    assert (out / "alice/01_attention/01_attention.ipynb").read_bytes() == latest.read_bytes()
    assert (out / "bob/01_attention/01_attention.ipynb").read_bytes() == notebook("01_attention", 3)
    assert not list(out.rglob("timestamp.txt")), "Canvas downloads hold no submission time"
    rows = {Path(r["file"]).name: r for r in log_rows(out)}
    assert rows["liddellalice_101_9001_01_attention-2.ipynb"]["action"] == "collected"
    for older in ("liddellalice_101_9001_01_attention.ipynb", "liddellalice_101_9001_01_attention-1.ipynb"):
        assert rows[older]["action"] == "not collected" and rows[older]["anomaly"] == "resubmission"
    assert "late" in rows["stonebob_late_102_9002_01_attention.ipynb"]["anomaly"]
    assert "resubmission (3)" in said and "late (1)" in said
    assert "nothing of 01_attention in this download from 5 roster students: carol, dave, erin, frank, grace" in said


def test_moodle_zip_with_grading_worksheet(tmp_path, roster):
    dl = tmp_path / "moodle"
    put(dl, "Alice Liddell_501_assignsubmission_file_/01_attention.ipynb", notebook("01_attention", 0))
    put(dl, "Bob Stone_502_assignsubmission_file_/01_attention.ipynb", notebook("01_attention", 1))
    put(dl, "Bob Stone_502_assignsubmission_onlinetext_/onlinetext.html", b"<p>see notebook</p>")
    worksheet = (
        '"Identifier","Full name","Email address","Status","Grade","Last modified (submission)"\n'
        '"Participant 501","Alice Liddell","alice@example.org","Submitted","","Wednesday, 1 October 2025, 11:30 PM"\n'
        '"Participant 502","Bob Stone","bob@example.org","Submitted","","-"\n'
    )
    put(tmp_path, "worksheet.csv", worksheet.encode())
    out = tmp_path / "SUBMISSIONS"
    assert (
        main(
            [
                "collect",
                str(zip_folder(dl, tmp_path / "moodle.zip")),
                "--out",
                str(out),
                "--roster",
                str(roster),
                "--times",
                str(tmp_path / "worksheet.csv"),
                "--timezone",
                "Europe/Berlin",
            ]
        )
        == 0
    )
    assert (out / "alice/01_attention/01_attention.ipynb").is_file()
    assert (out / "bob/01_attention/01_attention.ipynb").is_file()
    # Moodle's time has no zone: read in --timezone (CEST, UTC+2).
    assert read_timestamp(out / "alice/01_attention") == ("2025-10-01T21:30:00+00:00", None)
    assert read_timestamp(out / "bob/01_attention") == (None, None)
    found = anomalies(out)
    assert "no submission time" in found["moodle.zip/Bob Stone_502_assignsubmission_file_/01_attention.ipynb"]
    assert "not a notebook" in found["moodle.zip/Bob Stone_502_assignsubmission_onlinetext_/onlinetext.html"]


def test_times_without_a_zone_say_which_zone_they_were_read_in(tmp_path, roster, capsys):
    """Moodle's worksheet names no zone: a forgotten --timezone moves every time by hours, so collect says the zone."""
    put(tmp_path, "moodle/Alice Liddell_501_assignsubmission_file_/01_attention.ipynb", notebook("01_attention"))
    worksheet = (
        '"Identifier","Full name","Last modified (submission)"\n'
        '"Participant 501","Alice Liddell","Wednesday, 1 October 2025, 11:30 PM"\n'
    )
    times = put(tmp_path, "worksheet.csv", worksheet.encode())
    args = ["collect", str(tmp_path / "moodle"), "--roster", str(roster), "--times", str(times)]
    assert main(args + ["--out", str(tmp_path / "A")]) == 0
    said = capsys.readouterr().out
    assert "times without a zone (1 from Moodle grading worksheet): read in UTC; if the LMS shows" in said
    assert main(args + ["--out", str(tmp_path / "B"), "--timezone", "Europe/Berlin"]) == 0
    assert "read in Europe/Berlin" in capsys.readouterr().out
    put(tmp_path, "times.csv", b"student,lesson,submitted_at\nalice,01_attention,2025-10-01T21:30:00Z\n")
    assert main(args[:-1] + [str(tmp_path / "times.csv"), "--out", str(tmp_path / "C")]) == 0
    assert "without a zone" not in capsys.readouterr().out


def test_nbgrader_exchange_and_submitted(tmp_path):
    dl = tmp_path / "exchange"
    for when, variant in (("2025-10-01 10:00:00.000000 UTC", 0), ("2025-10-02 09:00:00.000000 UTC", 1)):
        folder = f"course/inbound/alice+01_attention+{when}+r{variant}"
        put(dl, f"{folder}/01_attention.ipynb", notebook("01_attention", variant))
        put(dl, f"{folder}/timestamp.txt", when.encode())
    put(dl, "submitted/bob/02_heads/02_heads.ipynb", notebook("02_heads"))
    put(dl, "submitted/bob/02_heads/timestamp.txt", b"2025-10-03 08:00:00.000000 UTC")
    out = tmp_path / "SUBMISSIONS"
    assert main(["collect", str(dl), "--out", str(out)]) == 0
    assert (out / "alice/01_attention/01_attention.ipynb").read_bytes() == notebook("01_attention", 1)
    assert read_timestamp(out / "alice/01_attention")[0] == "2025-10-02T09:00:00+00:00"
    assert read_timestamp(out / "bob/02_heads")[0] == "2025-10-03T08:00:00+00:00"


def test_times_csv_and_recollection(tmp_path, roster):
    dl = tmp_path / "dl"
    put(dl, "alice/01_attention.ipynb", notebook("01_attention", 0))
    times = put(tmp_path, "times.csv", b"lms_id,lesson,submitted_at\n101,01_attention,2025-10-01T12:00:00-04:00\n")
    out = tmp_path / "SUBMISSIONS"
    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster), "--times", str(times)]) == 0
    assert read_timestamp(out / "alice/01_attention")[0] == "2025-10-01T16:00:00+00:00"
    # A later download without times (a plain folder) replaces the notebook and keeps the stored time.
    put(dl, "alice/01_attention.ipynb", notebook("01_attention", 1))
    put(dl, "bob/02_heads.ipynb", notebook("02_heads"))
    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster)]) == 0
    assert read_timestamp(out / "alice/01_attention")[0] == "2025-10-01T16:00:00+00:00"
    assert {"replaced", "time kept"} <= anomalies(out)["alice/01_attention.ipynb"]
    row = next(r for r in log_rows(out) if r["file"] == "alice/01_attention.ipynb")
    assert "kept the submission time 2025-10-01T16:00:00+00:00" in row["detail"]
    assert (out / "bob/02_heads/02_heads.ipynb").is_file()
    # An older real time keeps the stored one too; only a newer one replaces it, and says what it replaced.
    for when, stored, kind in [
        ("2025-09-30T12:00:00+00:00", "2025-10-01T16:00:00+00:00", "time kept"),
        ("2025-10-02T12:00:00+00:00", "2025-10-02T12:00:00+00:00", "time replaced"),
    ]:
        put(tmp_path, "times.csv", f"lms_id,lesson,submitted_at\n101,01_attention,{when}\n".encode())
        assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster), "--times", str(times)]) == 0
        assert read_timestamp(out / "alice/01_attention")[0] == stored
        row = next(r for r in log_rows(out) if r["file"] == "alice/01_attention.ipynb")
        assert kind in row["anomaly"] and "2025-10-01T16:00:00+00:00" in row["detail"]


def test_a_new_download_without_an_unchanged_notebooks_time_keeps_it_silently(tmp_path, roster, capsys):
    """The whole assignment downloaded again after one resubmission, with the times of the resubmission only:
    the others' notebooks are the same, so their stored times still hold and nothing is 'no submission time'."""
    dl, out = tmp_path / "dl", tmp_path / "SUBMISSIONS"
    put(dl, "liddellalice_101_9001_01_attention.ipynb", notebook("01_attention", 0))
    put(dl, "stonebob_102_9002_01_attention.ipynb", notebook("01_attention", 1))
    times = put(
        tmp_path,
        "times.csv",
        b"lms_id,lesson,submitted_at\n101,01_attention,2025-10-01T12:00:00+00:00\n"
        b"102,01_attention,2025-10-01T13:00:00+00:00\n",
    )
    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster), "--times", str(times)]) == 0
    put(dl, "stonebob_102_9012_01_attention-1.ipynb", notebook("01_attention", 2))
    put(tmp_path, "times.csv", b"lms_id,lesson,submitted_at\n102,01_attention,2025-10-02T09:00:00+00:00\n")
    capsys.readouterr()
    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster), "--times", str(times)]) == 0
    assert "no submission time" not in capsys.readouterr().out
    alice = next(r for r in log_rows(out) if r["file"] == "liddellalice_101_9001_01_attention.ipynb")
    assert (alice["anomaly"], alice["submitted_at"], alice["time_source"]) == (
        "",
        "2025-10-01T12:00:00+00:00",
        "stored before",
    )
    assert read_timestamp(out / "alice/01_attention")[0] == "2025-10-01T12:00:00+00:00"
    assert read_timestamp(out / "bob/01_attention")[0] == "2025-10-02T09:00:00+00:00"
    # A changed notebook that the times do not list keeps the old time, and says so.
    put(dl, "liddellalice_101_9021_01_attention-1.ipynb", notebook("01_attention", 3))
    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster), "--times", str(times)]) == 0
    assert "time kept" in anomalies(out)["liddellalice_101_9021_01_attention-1.ipynb"]


def test_messy_download_reports_every_anomaly(tmp_path, roster, capsys):
    dl = tmp_path / "messy"
    put(dl, "alice/01_attention/01_attention.ipynb", notebook("01_attention"))
    put(dl, "alice/01_attention/.ipynb_checkpoints/01_attention-checkpoint.ipynb", notebook("01_attention", 9))
    put(dl, "alice/02_heads.ipynb", notebook("02_heads"))  # lessons in one folder
    put(dl, "Bob/01_Attention/01_Attention.ipynb", notebook("01_attention"))  # wrong case, three times
    put(dl, "carol/01_attention/01_attention (1).ipynb", notebook("01_attention", 1))  # two renamed copies
    put(dl, "carol/01_attention/01_attention (2).ipynb", notebook("01_attention", 2))
    put(dl, "dave/02_heads/01_attention.ipynb", notebook("01_attention"))  # in the wrong folder
    put(dl, "erin/01_attention/01_attention.ipynb", b"")  # empty
    put(dl, "erin/01_attention/answers.py", b"print('hi')\n")  # not a notebook
    put(dl, "frank/01_attention/01_attention.ipynb", b"{not json")  # unreadable
    put(dl, "frank/mystery.ipynb", notebook("02_heads", metadata=False))  # no lesson anywhere
    put(dl, "mallory/01_attention/01_attention.ipynb", notebook("01_attention"))  # not in the roster
    put(dl, "01_attention.ipynb", notebook("01_attention"))  # nobody's
    put(dl, "__MACOSX/alice/01_attention/._01_attention.ipynb", b"\0\5\26\7")
    put(dl, "hoppergrace_777_1001_01_attention.ipynb", notebook("01_attention", 3))  # Canvas resubmission
    put(dl, "hoppergrace_777_1001_01_attention-1.ipynb", notebook("01_attention", 4))
    (dl / "zed").symlink_to("/etc", target_is_directory=True)
    out = tmp_path / "SUBMISSIONS"

    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster)]) == 0
    said = capsys.readouterr().out
    found = anomalies(out)
    expected = {
        "alice/01_attention/.ipynb_checkpoints/01_attention-checkpoint.ipynb": "checkpoint",
        "Bob/01_Attention/01_Attention.ipynb": "wrong case",
        "carol/01_attention/01_attention (1).ipynb": "two candidates",
        "carol/01_attention/01_attention (2).ipynb": "two candidates",
        "dave/02_heads/01_attention.ipynb": "wrong lesson",
        "erin/01_attention/01_attention.ipynb": "empty",
        "erin/01_attention/answers.py": "not a notebook",
        "frank/01_attention/01_attention.ipynb": "unreadable notebook",
        "frank/mystery.ipynb": "unknown lesson",
        "mallory/01_attention/01_attention.ipynb": "unmatched",
        "01_attention.ipynb": "unmatched",
        "__MACOSX/alice/01_attention/._01_attention.ipynb": "__MACOSX",
        "hoppergrace_777_1001_01_attention.ipynb": "resubmission",
        "zed": "symlink",
    }
    for file, kind in expected.items():
        assert kind in found[file], (file, found[file])
        assert f"{kind} (" in said
    collected = sorted(str(p.relative_to(out)) for p in out.rglob("*.ipynb"))
    assert collected == [
        "alice/01_attention/01_attention.ipynb",
        "alice/02_heads/02_heads.ipynb",
        "bob/01_attention/01_attention.ipynb",
        "dave/01_attention/01_attention.ipynb",
        "grace/01_attention/01_attention.ipynb",
    ]
    assert (out / "grace/01_attention/01_attention.ipynb").read_bytes() == notebook("01_attention", 4)
    # Every file of the download is accounted for, collected or not.
    files = {str(p.relative_to(dl)) for p in dl.rglob("*") if p.is_file() and not p.is_relative_to(dl / "zed")}
    assert files | {"zed"} == set(found)


def evil_zip(path, name, data=b"{}", attr=None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        if attr is not None:
            info.external_attr = attr << 16
        z.writestr(info, data)
        z.writestr("alice/01_attention.ipynb", notebook("01_attention"))
    return path


@pytest.mark.parametrize(
    "name,data,attr,why",
    [
        ("../../escaped.ipynb", b"{}", None, "escapes the output folder"),
        ("alice/link.ipynb", b"/etc/passwd", stat.S_IFLNK | 0o777, "symbolic link"),
        ("alice/bomb.ipynb", bytes(3 << 20), None, "zip bomb"),
    ],
    ids=["zip-slip", "symlink", "zip-bomb"],
)
def test_unsafe_archives_are_refused(tmp_path, capsys, name, data, attr, why):
    out = tmp_path / "SUBMISSIONS"
    assert main(["collect", str(evil_zip(tmp_path / "dl.zip", name, data, attr)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and err.count("\n") == 0 and "nothing was collected" in err
    assert not out.exists() and not (tmp_path.parent / "escaped.ipynb").exists()


def test_unsafe_archive_a_student_uploaded_is_one_anomaly(tmp_path):
    dl = tmp_path / "dl"
    put(dl, "alice/01_attention.ipynb", notebook("01_attention"))
    evil_zip(dl / "bobstone_102_9002_work.zip", "../escaped.ipynb")
    out = tmp_path / "SUBMISSIONS"
    assert main(["collect", str(dl), "--out", str(out)]) == 0
    assert "unsafe archive" in anomalies(out)["bobstone_102_9002_work.zip"]
    assert (out / "alice/01_attention/01_attention.ipynb").is_file()


@pytest.mark.parametrize(
    "setup,args,message",
    [
        (lambda t: put(t, "dl.zip", b"this is not a zip"), [], "not a zip archive"),
        (lambda t: put(t, "dl/a/01_attention.ipynb", b"{}"), ["--roster", "missing.csv"], "cannot read the roster"),
        (
            lambda t: put(t, "dl/a/01_attention.ipynb", b"{}") and put(t, "r.csv", b"student,lms_id\na,1\nb,1\n"),
            ["--roster", "r.csv"],
            "duplicate lms_id",
        ),
        (
            lambda t: put(t, "dl/a/01_attention.ipynb", b"{}") and put(t, "r.csv", b"name,email\nA,a@x\n"),
            ["--roster", "r.csv"],
            "no 'student' column",
        ),
        (
            lambda t: put(t, "dl/a/01_attention.ipynb", b"{}") and put(t, "r.csv", b"student\n../x\n"),
            ["--roster", "r.csv"],
            "cannot name a folder",
        ),
        (
            lambda t: (
                put(t, "dl/a/01_attention.ipynb", b"{}")
                and put(t, "times.csv", b"student,lesson,submitted_at\na,01_attention,soon\n")
            ),
            ["--times", "times.csv"],
            "is not a time",
        ),
        (
            lambda t: (
                put(t, "dl/liddellalice_101_9001_01_attention.ipynb", notebook("01_attention"))
                and put(t, "r.csv", b"student,email\nalice,alice@example.org\n")
            ),
            ["--roster", "r.csv"],
            "has no 'lms_id' or 'name' column, which the download names its students by",
        ),
        (lambda t: put(t, "dl/a/01_attention.ipynb", b"{}"), ["--timezone", "Mars/Olympus"], "unknown time zone"),
        (lambda t: put(t, "dl/a/01_attention.ipynb", b"{}"), ["--out", "dl/SUB"], "inside the download"),
    ],
    ids=[
        "not-a-zip",
        "unreadable-roster",
        "duplicate-id",
        "no-student-column",
        "unsafe-id",
        "bad-time",
        "roster-without-lms-id",
        "bad-zone",
        "out-inside",
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, setup, args, message):
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    source = "dl.zip" if (tmp_path / "dl.zip").exists() else "dl"
    argv = ["collect", source] + (["--out", "SUBMISSIONS"] if "--out" not in args else []) + args
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "SUBMISSIONS").exists()


def test_read_clues_of_each_layout():
    lessons = nbk.lesson_names()
    canvas = col.read_clues(("smithjohn_late_12345_67890_01_attention-2.ipynb",), lessons)
    assert canvas.who == [("lms_id", "12345"), ("name", "smithjohn")] and canvas.late and canvas.version == (2, "")
    assert canvas.file_name == "01_attention.ipynb"
    moodle = col.read_clues(("John Smith_42_assignsubmission_file_", "work.ipynb"), lessons)
    assert moodle.who == [("participant", "42"), ("name", "John Smith")] and moodle.file_name == "work.ipynb"
    flat = col.read_clues(("jsmith_01_attention.ipynb",), lessons)
    assert flat.who[0] == ("id", "jsmith") and flat.file_name == "01_attention.ipynb"
    plain = col.read_clues(("submitted", "jsmith", "02_heads", "02_heads.ipynb"), lessons)
    assert plain.who == [("id", "jsmith")] and plain.folder_lesson == "02_heads"


def test_each_lms_is_read_by_a_module_of_its_own():
    """collect.py files what canvas.py, moodle.py and exchange.py read, each an LMS's names and nothing else of
    collect's (tests/grader/test_layout.py holds the imports); a name is tried against Canvas's first."""
    from autograder.adapters import canvas, exchange, moodle

    assert col.LMS == (canvas, moodle, exchange)
    for name, lms in [
        ("smithjohn_12345_67890_01_attention.ipynb", canvas),
        ("John Smith_42_assignsubmission_file_", moodle),
        ("jsmith+01_attention+2024-10-01 12:00:00 UTC", exchange),
        ("smithjohn_12345_67890_John Smith_42_assignsubmission_file_", canvas),
    ]:
        assert col.lms_entry(name)[0] is lms, name
    inbound = col.read_clues(
        ("inbound", "jsmith+01_attention+2024-10-01 12:00:00 UTC", "01_attention.ipynb"), nbk.lesson_names()
    )
    assert inbound.who == [("id", "jsmith")] and inbound.folder_lesson == "01_attention"
    assert inbound.version == (0, "2024-10-01 12:00:00 UTC")
    assert col.parse_time("2024-10-01 12:00:00.123456 UTC").utcoffset().total_seconds() == 0
    assert col.parse_time("Tuesday, 1 October 2024, 11:59 PM").hour == 23


def test_collection_csv_neutralises_formulas(tmp_path):
    dl = tmp_path / "dl"
    put(dl, "=cmd/01_attention.ipynb", notebook("01_attention"))
    out = tmp_path / "SUBMISSIONS"
    assert main(["collect", str(dl), "--out", str(out)]) == 0
    with open(out / "collection.csv", newline="") as f:
        files = [row["file"] for row in csv.DictReader(f)]
    assert files == ["'=cmd/01_attention.ipynb"]


# ---------------------------------------------------------------------------------------------
# The student is whoever the LMS says uploaded the file: names inside an upload choose no one
# ---------------------------------------------------------------------------------------------


def zip_bytes(members):
    """A zip in memory of {name: bytes}."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def collect_of(tmp_path, dl, *args, out="SUBMISSIONS"):
    """(SUBMISSIONS, what collect printed, {file: row of collection.csv}) after collecting dl."""
    out = tmp_path / out
    stream = io.StringIO()
    assert col.collect(dl, out, *args, stream=stream) is not None
    return out, stream.getvalue(), {r["file"]: r for r in log_rows(out)}


def collected(out, student, lesson="01_attention"):
    path = out / student / lesson / f"{lesson}.ipynb"
    return path.read_bytes() if path.is_file() else None


FAKE = "stonebob_102_9002_01_attention-9.ipynb"  # bob's Canvas entry, "resubmission 9"


def bobs_metadata():
    """A notebook whose metadata claims to be bob's (nothing reads it as an identity)."""
    nb = json.loads(notebook("01_attention", 8))
    nb["metadata"].update(student="bob", lms_id="102", nbgrader={"student": "bob"})
    return json.dumps(nb).encode()


@pytest.mark.parametrize("upload", ["zip", "zip in zip"])
def test_canvas_upload_naming_a_classmate_stays_with_its_uploader(tmp_path, upload):
    dl = tmp_path / "canvas"
    member = {FAKE: notebook("01_attention", 9)}
    for _ in range(upload.count("in zip")):
        member = {"inner.zip": zip_bytes(member)}
    put(dl, "liddellalice_101_9001_work.zip", zip_bytes(member))  # alice's upload
    put(dl, "stonebob_102_9002_01_attention.ipynb", notebook("01_attention", 1))  # bob's real notebook
    # honest classmates beside them: a zipped lesson folder, a renamed copy, Canvas's own resubmissions
    put(
        dl,
        "danverscarol_103_9003_carol.zip",
        zip_bytes({"01_attention/01_attention.ipynb": notebook("01_attention", 3)}),
    )
    put(dl, "bowmandave_104_9004_01_attention (1).ipynb", notebook("01_attention", 4))
    put(dl, "brockovicherin_105_9005_01_attention.ipynb", notebook("01_attention", 5))
    put(dl, "brockovicherin_105_9005_01_attention-1.ipynb", notebook("01_attention", 6))
    put(dl, "poolefrank_106_9006_work.zip", zip_bytes({"01_attention.ipynb": bobs_metadata()}))
    for args in ((), (load_roster(put(tmp_path, "roster.csv", ROSTER.encode())),)):
        out, said, rows = collect_of(tmp_path, dl, *args, out=f"SUBMISSIONS{len(args)}")
        bob = "bob" if args else "stonebob"
        assert collected(out, bob) == notebook("01_attention", 1), "bob keeps his own notebook"
        assert "resubmission" not in rows["stonebob_102_9002_01_attention.ipynb"]["anomaly"]
        fake = next(r for f, r in rows.items() if f.endswith(FAKE))
        assert fake["student"] == ("alice" if args else "liddellalice") and fake["action"] == "collected"
        assert "names another student" in fake["anomaly"] and "names another student (1)" in said
        assert collected(out, "alice" if args else "liddellalice") == notebook("01_attention", 9)
        if args:
            assert collected(out, "carol") == notebook("01_attention", 3)
            assert collected(out, "dave") == notebook("01_attention", 4)
            assert collected(out, "erin") == notebook("01_attention", 6)
            assert collected(out, "frank") == bobs_metadata()
            assert all("names another student" not in r["anomaly"] for r in rows.values() if r is not fake)


def test_canvas_resubmission_order_comes_only_from_the_outer_name(tmp_path, roster):
    dl = tmp_path / "canvas"
    put(dl, "liddellalice_101_9001_01_attention.ipynb", notebook("01_attention", 0))
    put(dl, "liddellalice_101_9001_01_attention-1.ipynb", notebook("01_attention", 1))  # her latest
    put(
        dl,
        "liddellalice_101_9001_old.zip",  # "resubmission 9" inside
        zip_bytes({"liddellalice_101_9001_01_attention-9.ipynb": notebook("01_attention", 9)}),
    )
    # bob resubmits a zip: Canvas's -1 on the zip's own name orders his two uploads
    put(dl, "stonebob_102_9002_work.zip", zip_bytes({"01_attention/01_attention.ipynb": notebook("01_attention", 2)}))
    put(dl, "stonebob_102_9002_work-1.zip", zip_bytes({"01_attention/01_attention.ipynb": notebook("01_attention", 3)}))
    out, _, rows = collect_of(tmp_path, dl, load_roster(roster))
    assert collected(out, "alice") == notebook("01_attention", 1)
    inner = rows["liddellalice_101_9001_old.zip/liddellalice_101_9001_01_attention-9.ipynb"]
    assert inner["action"] == "not collected" and "resubmission" in inner["anomaly"]
    assert collected(out, "bob") == notebook("01_attention", 3)


@pytest.mark.parametrize("inside", ["moodle folder", "canvas name", "zip of a moodle folder", "worksheet"])
def test_moodle_upload_naming_a_classmate_stays_with_its_uploader(tmp_path, roster, inside):
    dl = tmp_path / "moodle"
    mine = "Alice Liddell_501_assignsubmission_file_"
    bobs = "Bob Stone_502_assignsubmission_file_"
    put(dl, f"{bobs}/01_attention.ipynb", notebook("01_attention", 1))
    put(dl, "Carol Danvers_503_assignsubmission_file_/01_attention (1).ipynb", notebook("01_attention", 3))
    if inside == "moodle folder":
        put(dl, f"{mine}/{bobs}/01_attention.ipynb", notebook("01_attention", 9))
    elif inside == "canvas name":
        put(dl, f"{mine}/{FAKE}", notebook("01_attention", 9))
    elif inside == "zip of a moodle folder":
        put(dl, f"{mine}/work.zip", zip_bytes({f"{bobs}/01_attention.ipynb": notebook("01_attention", 9)}))
    else:  # a grading worksheet of her own that says participant 501 is bob
        put(dl, f"{mine}/01_attention.ipynb", notebook("01_attention", 9))
        put(
            dl,
            f"{mine}/grades.csv",
            b'"Identifier","Full name","Email address","Last modified (submission)"\n'
            b'"Participant 501","Bob Stone","bob@example.org","1 October 2025, 11:00 PM"\n',
        )
    out, said, rows = collect_of(tmp_path, dl, load_roster(roster))
    assert collected(out, "bob") == notebook("01_attention", 1)
    assert collected(out, "carol") == notebook("01_attention", 3)
    assert collected(out, "alice") == notebook("01_attention", 9)
    assert not (out / "alice/01_attention/timestamp.txt").exists()
    flagged = [
        r for r in rows.values() if "names another student" in r["anomaly"] or "worksheet in an upload" in r["anomaly"]
    ]
    assert len(flagged) == 1 and flagged[0]["file"].startswith(mine)


@pytest.mark.parametrize("inside", ["exchange entry", "submitted folder", "later exchange entry of her own"])
def test_nbgrader_exchange_contents_choose_no_student_and_no_order(tmp_path, inside):
    dl = tmp_path / "exchange"
    t1, t2, t9 = "2025-10-01 10:00:00.000000 UTC", "2025-10-02 10:00:00.000000 UTC", "2099-01-01 00:00:00.000000 UTC"
    put(dl, f"course/inbound/bob+01_attention+{t1}+r1/01_attention.ipynb", notebook("01_attention", 1))
    put(dl, f"course/inbound/bob+01_attention+{t1}+r1/timestamp.txt", t1.encode())
    alice = f"course/inbound/alice+01_attention+{t1}+r2"
    put(dl, f"{alice}/01_attention.ipynb", notebook("01_attention", 2))
    put(dl, f"{alice}/timestamp.txt", t1.encode())
    put(dl, f"course/inbound/alice+01_attention+{t2}+r3/01_attention.ipynb", notebook("01_attention", 3))
    put(dl, f"course/inbound/alice+01_attention+{t2}+r3/timestamp.txt", t2.encode())
    who = "alice" if inside == "later exchange entry of her own" else "bob"
    if inside == "submitted folder":
        nested = "submitted/bob/01_attention"
    else:
        nested = f"{who}+01_attention+{t9}+r9"
    put(dl, f"{alice}/{nested}/01_attention.ipynb", notebook("01_attention", 9))
    put(dl, f"{alice}/{nested}/timestamp.txt", t9.encode())
    put(dl, "submitted/carol/01_attention/01_attention.ipynb", notebook("01_attention", 4))
    put(dl, "submitted/carol/01_attention/timestamp.txt", t2.encode())
    put(dl, "submitted/dave/01_attention/dave/01_attention/01_attention.ipynb", notebook("01_attention", 5))
    out, _, rows = collect_of(tmp_path, dl)
    assert collected(out, "bob") == notebook("01_attention", 1)
    assert read_timestamp(out / "bob/01_attention")[0] == "2025-10-01T10:00:00+00:00"
    assert collected(out, "alice") == notebook("01_attention", 3), "her latest exchange entry, by its own name"
    assert read_timestamp(out / "alice/01_attention")[0] == "2025-10-02T10:00:00+00:00"
    assert collected(out, "carol") == notebook("01_attention", 4)
    assert collected(out, "dave") == notebook("01_attention", 5)
    fake = rows[f"{alice}/{nested}/01_attention.ipynb"]
    assert fake["student"] == "alice" and fake["action"] == "not collected"
    assert ("names another student" in fake["anomaly"]) == (who == "bob")


# Alone and without a roster, alice/bob/01_attention/ cannot say which of its folders is the student.
@pytest.mark.parametrize(
    "with_roster,classmates",
    [(False, True), (True, True), (True, False)],
    ids=["class", "class-roster", "alone-roster"],
)
def test_plain_folder_holding_a_classmates_folder_stays_with_its_owner(tmp_path, roster, with_roster, classmates):
    dl = tmp_path / "plain"
    put(dl, "alice/bob/01_attention/01_attention.ipynb", notebook("01_attention", 9))
    if classmates:
        put(dl, "bob/01_attention/01_attention.ipynb", notebook("01_attention", 1))
        put(dl, "carol/01_attention (1).ipynb", notebook("01_attention", 3))
        put(dl, "dave/work.zip", zip_bytes({"01_attention/01_attention.ipynb": notebook("01_attention", 4)}))
        put(dl, f"erin/{FAKE}", notebook("01_attention", 5))  # bob's Canvas name in erin's folder
    out, _, rows = collect_of(tmp_path, dl, *([load_roster(roster)] if with_roster else []))
    assert collected(out, "alice") == notebook("01_attention", 9)
    assert rows["alice/bob/01_attention/01_attention.ipynb"]["student"] == "alice"
    if classmates:
        assert collected(out, "bob") == notebook("01_attention", 1)
        assert collected(out, "carol") == notebook("01_attention", 3)
        assert collected(out, "dave") == notebook("01_attention", 4)
        assert collected(out, "erin") == notebook("01_attention", 5)
    if with_roster:
        assert "names another student" in rows["alice/bob/01_attention/01_attention.ipynb"]["anomaly"]


def test_timestamp_inside_a_students_upload_is_not_a_submission_time(tmp_path, roster):
    dl = tmp_path / "canvas"
    put(
        dl,
        "liddellalice_101_9001_work.zip",
        zip_bytes(
            {
                "01_attention/01_attention.ipynb": notebook("01_attention"),
                "01_attention/timestamp.txt": b"2025-01-01 00:00:00 UTC",
            }
        ),
    )
    out, _, rows = collect_of(tmp_path, dl, load_roster(roster))
    assert collected(out, "alice") == notebook("01_attention")
    assert read_timestamp(out / "alice/01_attention") == (None, None)
    assert "not a submission time" in rows["liddellalice_101_9001_work.zip/01_attention/timestamp.txt"]["detail"]


@pytest.mark.parametrize(
    "name,uploader",
    [
        ("liddellalice_101_9001_x_102_assignsubmission_file_01_attention.ipynb", "alice"),  # Moodle-shaped, bob's id
        ("liddellalice_101_9001_stonebob+01_attention+2099-01-01.ipynb", "alice"),  # an exchange entry's shape
        ("Alice Liddell_501_assignsubmission_file_stonebob+01_attention+2099-01-01.ipynb", "alice"),
    ],
    ids=["canvas-moodle", "canvas-exchange", "moodle-exchange"],
)
def test_the_file_name_a_student_chose_cannot_reshape_the_lms_name(tmp_path, roster, name, uploader):
    """The tail of a Canvas or Moodle name is the student's own file name: it never makes the name another LMS's."""
    dl = tmp_path / "dl"
    put(dl, name, notebook("01_attention", 9))
    put(dl, "stonebob_102_9002_01_attention.ipynb", notebook("01_attention", 1))
    out, _, rows = collect_of(tmp_path, dl, load_roster(roster))
    assert collected(out, "bob") == notebook("01_attention", 1)
    assert rows[name]["student"] == uploader and collected(out, uploader) == notebook("01_attention", 9)


def test_a_time_for_a_student_or_lesson_nobody_knows_stops_collect(tmp_path, roster, capsys):
    dl = tmp_path / "dl"
    put(dl, "alice/01_attention.ipynb", notebook("01_attention", 0))
    out = tmp_path / "SUBMISSIONS"
    for line, named in (("ghopper,01_attention", "id 'ghopper'"), ("alice,01_atention", "lesson '01_atention'")):
        times = put(tmp_path, "times.csv", f"student,lesson,submitted_at\n{line},2025-10-01T12:00:00Z\n".encode())
        args = ["collect", str(dl), "--out", str(out), "--roster", str(roster), "--times", str(times)]
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert f"the times file times.csv names {named}" in err and "\n" not in err and not out.exists()
    assert main(args + ["--allow-mismatch"]) == 0


def test_a_notebook_renamed_beyond_its_lessons_name_gets_a_rename_note(tmp_path, roster):
    """`lesson1_final.ipynb` (named for no lesson, found by its cells) and Moodle's `my work.ipynb` are renamed too,
    as `01_attention (1).ipynb` always was; a lesson 03 notebook in a download for 01 names lesson 03."""
    dl = tmp_path / "dl"
    put(dl, "alice/lesson1_final.ipynb", notebook("01_attention", 0))
    put(dl, "Bob Stone_502_assignsubmission_file_/my work.ipynb", notebook("02_heads", 0))
    out = tmp_path / "SUBMISSIONS"
    assert main(["collect", str(dl), "--out", str(out), "--roster", str(roster)]) == 0
    found = {f: (kinds, r["detail"]) for r in log_rows(out) for f, kinds in anomalies(out).items() if r["file"] == f}
    assert "renamed" in found["alice/lesson1_final.ipynb"][0]
    assert "named 'lesson1_final.ipynb', not 01_attention.ipynb" in found["alice/lesson1_final.ipynb"][1]
    assert "named 'my work.ipynb', not 02_heads.ipynb" in found["Bob Stone_502_assignsubmission_file_/my work.ipynb"][1]
    assert "renamed" not in str(anomalies(out).get("alice/01_attention.ipynb", ""))
    put(tmp_path / "dl3", "alice/01_attention.ipynb", notebook("03_multi_head", 0))
    assert (
        main(
            [
                "collect",
                str(tmp_path / "dl3"),
                "--out",
                str(tmp_path / "S3"),
                "--roster",
                str(roster),
                "--lesson",
                "01_attention",
            ]
        )
        == 0
    )
    assert "a 03_multi_head notebook in a download collected for 01_attention" in log_rows(tmp_path / "S3")[0]["detail"]
