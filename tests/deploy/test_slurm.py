"""examples/slurm on a real Slurm: a one-node cluster (munged, slurmctld and slurmd on 127.0.0.1,
started here with their own configuration and state in a temporary folder) grades a tiny class
with submit.sh, as an array job and a merge job; the merged grades.csv must equal a single run's.
A second submission with a task that fails shows that the merge still runs (afterany) and
refuses the incomplete set.

Skips, saying why, only where Slurm is not installed or cannot start; under CI (CI=true) it
fails instead. `make setup` installs slurm-wlm and munge where it runs as root."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autograder import notebook as nbk
from autograder.release import release
from tests.harness import mutants
from tests.harness.lessons import fill

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LESSON = "01_attention"
DAEMONS = {name: shutil.which(name) or f"/usr/sbin/{name}" for name in ("munged", "slurmctld", "slurmd")}


def unavailable(why):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm test cannot run under CI: {why}")
    pytest.skip(f"no Slurm here: {why} (make setup installs slurm-wlm and munge when run as root)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """ClusterName=mhatest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    """munged, slurmctld and slurmd, in the foreground of processes this object owns."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-"))  # short: the munge socket path is limited
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=str(self.dir / "slurm.conf"))

    def start(self):
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (d / "slurm.conf").write_text(
            SLURM_CONF.format(d=d, ctld_port=free_port(), slurmd_port=free_port(), cpus=min(os.cpu_count() or 1, 2))
        )
        self._daemon(
            "munged",
            "-F",
            "-f",
            f"--socket={d}/munge.sock",
            f"--key-file={key}",
            f"--pid-file={d}/munged.pid",
            f"--seed-file={d}/munged.seed",
            f"--log-file={d}/munged.log",
        )
        self._wait(lambda: (d / "munge.sock").exists(), "munged did not start")
        self._daemon("slurmctld", "-D", "-f", str(d / "slurm.conf"))
        self._daemon("slurmd", "-D", "-N", "localhost", "-f", str(d / "slurm.conf"))
        self._wait(
            lambda: self.slurm("sinfo", "-h", "-o", "%t", check=False).stdout.strip() == "idle",
            "the node did not become idle",
        )

    def _daemon(self, name, *args):
        log = open(self.dir / f"{name}.out", "wb")
        self.procs.append(
            (
                name,
                subprocess.Popen(
                    [DAEMONS[name], *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
                ),
            )
        )
        log.close()

    def _wait(self, ready, why, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [name for name, p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{why}: {dead[0]} exited: {self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{why} within {timeout} s: {self.logs()}")

    def logs(self):
        return " | ".join(
            f"{f.name}: {f.read_text(errors='replace')[-600:]}"
            for f in sorted(self.dir.glob("*.out")) + sorted(self.dir.glob("*.log"))
        )

    def slurm(self, *args, check=True):
        p = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=60)
        assert not check or p.returncode == 0, f"{args}: {p.stderr}"
        return p

    def state(self, job):
        """{job or array task id: state} while Slurm remembers the job (MinJobAge, 300 s)."""
        out = self.slurm("scontrol", "-o", "show", "job", job).stdout
        fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines()]
        return {f.get("ArrayTaskId") or f["JobId"]: f["JobState"] for f in fields}

    def wait_done(self, *jobs, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {j: self.state(j) for j in jobs}
            if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for st in states.values() for s in st.values()):
                return states
            time.sleep(1)
        raise AssertionError(f"jobs {jobs} not done in {timeout} s: {states}; {self.logs()}")

    def stop(self):
        subprocess.run(["scancel", "--user", str(os.getuid())], env=self.env, capture_output=True, timeout=30)
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for _, p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    missing = [name for name, path in DAEMONS.items() if not os.access(path, os.X_OK)] + [
        name for name in ("sbatch", "scontrol", "sinfo") if not shutil.which(name)
    ]
    if missing:
        unavailable(f"{', '.join(missing)} not installed")
    if os.geteuid() != 0:
        unavailable("a one-node cluster whose slurmd starts jobs needs root")
    c = Cluster()
    try:
        try:
            c.start()
        except RuntimeError as e:
            unavailable(str(e))
        yield c
    finally:
        c.stop()
        assert all(p.poll() is not None for _, p in c.procs)  # every daemon it started is gone


@pytest.fixture(scope="module")
def tiny_class(tmp_path_factory):
    """4 students: solved, blank, and two mutants; and a single run's grades.csv."""
    root = tmp_path_factory.mktemp("slurm-class")
    release(root / "release", [LESSON])
    rel = nbk.read(root / "release" / LESSON / f"{LESSON}.ipynb")
    wrong = mutants.for_lesson(LESSON).MUTANTS
    for student, nb in (
        ("ada", fill(rel, LESSON)),
        ("bo", rel),
        ("cy", fill(rel, LESSON, {"softmax": wrong["softmax"][0][2]})),
        ("di", fill(rel, LESSON, {"causal_mask": wrong["causal_mask"][0][2]})),
    ):
        nbk.write(nb, root / "submissions" / student / LESSON / f"{LESSON}.ipynb")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(root / "submissions"),
            "--out",
            str(root / "single"),
            "--lesson",
            LESSON,
            "--jobs",
            "2",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return root


def submit(cluster, tiny_class, work, shards):
    """examples/slurm/submit.sh; returns (array job id, merge job id)."""
    env = dict(
        cluster.env,
        COURSE=str(REPO),
        SUBMISSIONS=str(tiny_class / "submissions"),
        WORK=str(work),
        SHARDS=str(shards),
        PYTHON=sys.executable,
    )
    # One CPU and little memory per task, so that both tasks fit the test's small node at once.
    p = subprocess.run(
        [str(REPO / "examples/slurm/submit.sh"), "--lesson", LESSON, "--", "--cpus-per-task=1", "--mem=256M"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    words = p.stdout.split()
    return words[words.index("array") + 2], words[words.index("merge") + 2].rstrip(":")


def test_array_and_merge_equal_a_single_run(cluster, tiny_class, tmp_path):
    start = time.monotonic()
    array, merge = submit(cluster, tiny_class, tmp_path / "work", shards=2)
    states = cluster.wait_done(array, merge)
    print(f"array job {array}, merge job {merge}: {states} in {time.monotonic() - start:.0f} s")
    assert set(states[array].values()) == {"COMPLETED"} and len(states[array]) == 2, cluster.logs()
    assert set(states[merge].values()) == {"COMPLETED"}, cluster.logs()
    for i in range(2):  # each task graded a part of the class, not all of it
        shard = (tmp_path / "work" / f"shard_{i}" / "grades.csv").read_text().splitlines()
        assert 1 < len(shard) < 1 + 4 * 3
    merged = (tmp_path / "work" / "merged" / "grades.csv").read_text()
    assert merged == (tiny_class / "single" / "grades.csv").read_text()


def test_a_failed_task_still_reaches_merge_which_refuses(cluster, tiny_class, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "shard_1").write_text("not a folder: task 1 fails at once")
    array, merge = submit(cluster, tiny_class, work, shards=2)
    states = cluster.wait_done(array, merge)
    assert states[array] == {"0": "COMPLETED", "1": "FAILED"}, states
    assert set(states[merge].values()) == {"FAILED"}, states  # it ran (afterany) and refused
    log = next(work.glob("mha-merge-*.out")).read_text()
    assert "shard_1" in log and not (work / "merged" / "grades.csv").exists(), log
    print(f"array job {array}, merge job {merge}: {states}; merge said: {log.strip().splitlines()[-1]}")


def test_every_task_and_the_merge_sign_with_one_key_outside_results(tmp_path):
    """submit.sh hands every task and the merge one MHA_RESULTS_KEY (sbatch exports the environment),
    made once, mode 0600, in WORK beside the shard folders, never inside one. sbatch is a stand-in
    here that records what each job would see."""
    bin_, work, subs = tmp_path / "bin", tmp_path / "work", tmp_path / "subs"
    (subs / "alice" / LESSON).mkdir(parents=True)
    bin_.mkdir()
    (bin_ / "sbatch").write_text('#!/bin/sh\necho "$MHA_RESULTS_KEY" >> "$WORK/keys"\necho 7\n')
    (bin_ / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "MHA_RESULTS_KEY"}
    env.update(
        PATH=f"{bin_}:{env['PATH']}",
        COURSE=str(REPO),
        SUBMISSIONS=str(subs),
        WORK=str(work),
        PYTHON=sys.executable,
        SHARDS="2",
    )
    p = subprocess.run(
        [str(REPO / "examples/slurm/submit.sh"), "--lesson", LESSON],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    keys = (work / "keys").read_text().split()
    assert keys == [str(work / "results.key")] * 2, keys  # the array and the merge
    assert (work / "results.key").stat().st_mode & 0o777 == 0o600
