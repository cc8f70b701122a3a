"""The ray runner against a real head that it starts itself (shared through
RECIPEVAL_RAY_STATE_DIR, as a pipeline run does), and `recipeval ray-down`, which must stop
that head and nothing else."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray", reason="ray[default] is not installed")

from runner_jobs import CRASH, ECHO_ARGV, HOSTILE_WORDS, WAIT_FOR_STOP, python_launch

from recipeval.runners import ray_head
from recipeval.runners.ray import RayRunner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared_head(tmp_path_factory):
    from ray._private.ray_constants import RESOURCES_ENVIRONMENT_VARIABLE

    state_dir = tmp_path_factory.mktemp("ray-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ray_head.STATE_DIR_ENV, str(state_dir))
        # Ray takes the head's node for an H100 node, as its GPU detection would label one.
        mp.setenv(RESOURCES_ENVIRONMENT_VARIABLE, json.dumps({"accelerator_type:H100": 1}))
        mp.delenv("RAY_ADDRESS", raising=False)
        runner = RayRunner()
        yield state_dir, runner
    ray_head.shared_head_down(state_dir)


def test_job_streams_output_env_and_hostile_values_stay_words(shared_head, tmp_path):
    _, runner = shared_head
    words = [w.format(marker=tmp_path / "pwned") for w in HOSTILE_WORDS]
    lines: list[str] = []
    result = runner.run(
        python_launch(ECHO_ARGV, *words, env={"RECIPEVAL_TEST_VALUE": "from-recipe"}),
        lines.append,
        timeout=120,
    )
    assert result.exit_code == 0, (result, lines)
    argv_line = next(line for line in lines if line.startswith("ARGV "))
    assert json.loads(argv_line[5:]) == words
    assert "ENV from-recipe" in lines
    assert not list(tmp_path.glob("pwned*"))


def test_second_runner_reuses_the_recorded_head(shared_head):
    state_dir, runner = shared_head
    again = RayRunner()  # the env var is still set by the fixture
    assert again.address == runner.address
    assert ray_head.read_state(state_dir).dashboard == runner.address


def test_crash_gives_exit_status_and_output(shared_head):
    _, runner = shared_head
    lines: list[str] = []
    result = runner.run(python_launch(CRASH), lines.append, timeout=120)
    assert result.exit_code == 1 and "FAILED" in result.detail
    assert any("planted crash" in line for line in lines)


def test_stop_on_request_stops_the_job_process(shared_head):
    _, runner = shared_head
    stop = threading.Event()
    program = "import os\nprint('PID', os.getpid(), flush=True)\n" + WAIT_FOR_STOP
    pid: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("PID "):
            pid.append(int(line.split()[1]))
        if line == "ready":
            stop.set()

    result = runner.run(python_launch(program), on_line, timeout=120, stop=stop)
    assert result.stopped and not result.timed_out and "STOPPED" in result.detail
    assert pid, "the job printed its pid"
    assert _gone(pid[0])


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# A pipeline's stage process running one job through the shared head, its lines on stdout.
STAGE_PROCESS = """
import sys
from runner_jobs import python_launch
from recipeval.runners.ray import RayRunner
RayRunner().run(python_launch(sys.argv[1]), lambda line: print(line, flush=True), timeout=300)
"""


def test_kill_9_of_the_stage_process_stops_its_ray_job(shared_head):
    """The watchdog stops the job through the Jobs API when the process that submitted it is
    killed without a chance to clean up."""
    _, runner = shared_head
    marker = f"# killed-stage-{os.getpid()}"
    program = "import os\nprint('PID', os.getpid(), flush=True)\n" + WAIT_FOR_STOP + marker
    stage = subprocess.Popen(
        [sys.executable, "-c", STAGE_PROCESS, program],
        cwd=Path(__file__).parent,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stage.stdout is not None
    pid = None
    for line in stage.stdout:
        if line.startswith("PID "):
            pid = int(line.split()[1])
        if line.strip() == "ready":
            break
    assert pid is not None, "the job printed its pid"
    stage.kill()
    stage.wait()
    job = psutil.Process(pid)
    job.wait(timeout=60)  # raises TimeoutExpired while the job lives on
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(runner.address)
    jobs = [j for j in client.list_jobs() if marker in j.entrypoint]
    assert len(jobs) == 1, [(j.submission_id, j.status) for j in jobs]
    deadline = time.monotonic() + 30  # the status follows the process's end
    while not str(client.get_job_status(jobs[0].submission_id)).endswith("STOPPED"):
        assert time.monotonic() < deadline, client.get_job_status(jobs[0].submission_id)
        time.sleep(0.5)


def test_timeout(shared_head):
    _, runner = shared_head
    result = runner.run(python_launch(WAIT_FOR_STOP), lambda line: None, timeout=3)
    assert result.timed_out and result.exit_code is None and "timed out after 3 s" in result.detail


def test_cluster_wait_names_the_missing_nodes(shared_head):
    from ray.util.state import list_nodes

    from recipeval.runners.base import RunnerError
    from recipeval.runners.slurm import wait_for_nodes

    _, runner = shared_head
    [head] = list_nodes(address=runner.address)
    wait_for_nodes(runner.address, [head.node_name], gpus=0, timeout=30)
    with pytest.raises(RunnerError, match=r"missing nodes gpu-node-07; GPUs joined 0 of 8"):
        wait_for_nodes(runner.address, [head.node_name, "gpu-node-07"], gpus=8, timeout=2)


def test_an_external_cluster_names_the_cards_ray_found_on_its_nodes(shared_head):
    """A run on a cluster named by RAY_ADDRESS recorded no card (it is not this node), so a
    night on other cards could not be named as what changed. Ray's own detection says."""
    _, ours = shared_head
    described = RayRunner(address=ours.address).describe()
    assert (described["head"], described["gpu"]) == ("external", "H100")
    # a cluster that cannot be asked names no card and fails nothing
    assert RayRunner(address="http://127.0.0.1:1").describe()["gpu"] is None


def test_ray_down_stops_only_our_head(shared_head, tmp_path):
    state_dir, _ = shared_head
    state = ray_head.read_state(state_dir)
    assert state is not None and ray_head.head_alive(state)
    ours = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if state.temp_dir in " ".join(p.info["cmdline"] or [])
    ]
    assert ours, "the head's processes name its temp dir"
    # A process that looks like Ray but is not ours must survive.
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "ray::IDLE", "--temp-dir=/tmp/ray"]
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "recipeval", "ray-down", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0 and "stopped" in proc.stdout, proc.stderr
        assert decoy.poll() is None
        assert [pid for pid in ours if not _gone(pid)] == []
        assert ray_head.read_state(state_dir) is None
    finally:
        decoy.kill()
        decoy.wait()


def test_private_head_works_when_a_ray_auth_token_exists(tmp_path, monkeypatch):
    """Any local ray.init() leaves ~/.ray/auth_token; Ray 2.60 then turns token auth on for
    new heads. Our head and our client must still agree (seen on the shared CI machine)."""
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a" * 64)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv(ray_head.STATE_DIR_ENV, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lines: list[str] = []
    with RayRunner() as runner:
        result = runner.run(python_launch(ECHO_ARGV, "x"), lines.append, timeout=120)
        temp_dir = runner.describe()["ray_temp_dir"]
    assert result.exit_code == 0 and 'ARGV ["x"]' in lines
    assert [
        p for p in psutil.process_iter(["cmdline"]) if temp_dir in " ".join(p.info["cmdline"] or [])
    ] == []


# A stage process that starts a private head the way a stage does, inside the signal handling.
STARTS_A_HEAD = """
from recipeval.runners.base import stop_job_on_termination
from recipeval.runners.ray import RayRunner
with stop_job_on_termination(), RayRunner():
    pass
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_stage_stopped_while_its_private_head_starts_leaves_no_ray_process(signum):
    """The head is up to minutes from answering, and no job exists yet to guard it: Ctrl-C,
    SIGTERM and kill -9 in that window used to leave the whole head running."""
    tmp = Path(tempfile.mkdtemp(prefix="rvk", dir="/tmp"))  # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", ray_head.STATE_DIR_ENV)}
    stage = subprocess.Popen([sys.executable, "-c", STARTS_A_HEAD], env={**env, "TMPDIR": str(tmp)})
    head_log = tmp / f"recipeval-ray-{os.getuid()}" / f"ray-head-{stage.pid}.log"

    def of_this_head() -> list[psutil.Process]:
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(tmp) in " ".join(p.info["cmdline"] or [])
        ]

    try:
        deadline = time.monotonic() + 60
        while not (head_log.exists() and len(of_this_head()) > 2):
            assert stage.poll() is None and time.monotonic() < deadline, "the head never started"
            time.sleep(0.1)
        stage.send_signal(signum)
        stage.wait(timeout=60)
        deadline = time.monotonic() + 60
        while of_this_head():
            assert time.monotonic() < deadline, [p.info["cmdline"][:3] for p in of_this_head()]
            time.sleep(0.5)
    finally:
        stage.kill()
        for leftover in of_this_head():  # a failed run must not leak the head into the suite
            leftover.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _ray_down(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipeval", "ray-down", "--state-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ray_down_on_a_stale_record_kills_and_removes_nothing_else(tmp_path):
    """A head.json whose head is gone (its pid now another process) must not make ray-down
    kill that process's group, a process whose command line merely starts like the temp dir,
    or remove a folder named like a temp dir that Ray never used."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    precious = tmp_path / f"{ray_head.TEMP_PREFIX}precious"
    precious.mkdir()
    (precious / "data").write_text("keep")
    # its command line names a file whose name starts with the recorded temp dir's
    lookalike = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", f"{precious}-notes.txt"]
    )
    stale = ray_head.HeadState(
        pid=other.pid,
        create_time=1.0,
        dashboard="http://127.0.0.1:9",
        gcs="127.0.0.1:9",
        temp_dir=str(precious),
        log=str(state_dir / f"{ray_head.LOG_PREFIX}1.log"),
    )
    (state_dir / ray_head.STATE_FILE).write_text(json.dumps(dataclasses.asdict(stale)))
    try:
        proc = _ray_down(state_dir)
        assert proc.returncode == 0 and "no longer running" in proc.stdout, proc.stderr
        assert other.poll() is None and lookalike.poll() is None
        assert (precious / "data").read_text() == "keep"
        assert ray_head.read_state(state_dir) is None
    finally:
        for proc in (other, lookalike):
            proc.kill()
            proc.wait()
    missing = tmp_path / "never-made"
    assert "none running" in _ray_down(missing).stdout and not missing.exists()
    proc = _ray_down(precious / "data")
    assert proc.returncode == 2 and "not a folder" in proc.stderr
    assert "Traceback" not in proc.stderr


def _record(**fields: object) -> str:
    head = {
        "pid": 999_999,
        "create_time": 0.0,
        "dashboard": "http://127.0.0.1:9",
        "gcs": "127.0.0.1:9",
        "temp_dir": f"/tmp/{ray_head.TEMP_PREFIX}gone",
        "log": "LOG",
    }
    return json.dumps(head | fields)


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (_record(pid="abc"), "pid: Input should be a valid integer"),
        (_record(pid=-1), "pid: Input should be greater than 0"),
        (_record(pid=1e30), "pid: Input should be a valid integer"),
        (_record(temp_dir=5), "temp_dir: Input should be a valid string"),
        (_record(temp_dir="/home/me/data"), "is not a head's temp dir"),
        (_record(log="/home/me/ray-head-notes.txt"), "is not a head's log"),
        ("{", "Invalid JSON"),
        (None, "not a regular file"),
    ],
)
def test_ray_down_refuses_a_record_it_did_not_write_and_touches_nothing(tmp_path, record, problem):
    """Such a record made ray-down SIGKILL any process naming a path that starts like its
    temp_dir, rm -rf that folder and delete its log file, or end in a traceback."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    head = state_dir / ray_head.STATE_FILE
    if record is None:
        os.mkfifo(head)
    else:
        head.write_text(record.replace("LOG", str(state_dir / f"{ray_head.LOG_PREFIX}1.log")))
    proc = _ray_down(state_dir)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"recipeval: {head}: ") and problem in proc.stderr
    assert proc.stderr.endswith("; nothing was stopped or removed\n")
    assert head.exists()


def test_a_fifo_as_the_head_lock_is_refused_not_waited_on(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    os.mkfifo(state_dir / "head.lock")
    proc = _ray_down(state_dir)
    assert proc.returncode == 2 and "head.lock: not a regular file" in proc.stderr, proc.stderr
