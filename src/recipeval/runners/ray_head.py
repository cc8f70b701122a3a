"""A Ray head that recipeval starts itself, and only that one is ever stopped by recipeval.

Two lifetimes:
- private (default): started by one command's runner and stopped when that runner closes;
- shared: when RECIPEVAL_RAY_STATE_DIR names a folder, the first stage that needs Ray starts
  the head and records it in <dir>/head.json; later stages (other processes of the same
  pipeline run) reuse it; `recipeval ray-down` (run once at the end) stops it.

The head runs as `ray start --head --block` in a new session, with its own ports and its own
Ray temp dir, so stopping it signals that session and then any process whose command line
names that temp dir: nothing of another Ray on the machine is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import psutil
from pydantic import BaseModel, Field, ValidationError

from recipeval.atomic import atomic_write_text
from recipeval.errors import unreadable_reason
from recipeval.lockfile import locked_file
from recipeval.readfile import NotRegularFile, read_regular
from recipeval.runners.base import RunnerError

STATE_DIR_ENV = "RECIPEVAL_RAY_STATE_DIR"
STATE_FILE = "head.json"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
START_TIMEOUT_S = 180.0  # a loaded 2-core machine took over 60 s
# What `ray start --block` prints once its GCS and raylet are up (Ray 2.x); only then is the
# dashboard asked, so a starting head is not loaded with HTTP probes.
BLOCKING_LINE = "will now block forever"
READY_POLL_S = 0.25
# A head's own temp dir and log, by name: a record read back from disk (possibly stale, or not
# ours) never makes stop_head remove anything else.
TEMP_PREFIX, LOG_PREFIX = "rv-ray-", "ray-head-"
PID_MAX = 4_194_304  # Linux's highest pid_max
RECORD_LIMIT = 64 * 1024


@dataclass
class HeadState:
    pid: int  # the `ray start --block` process; leader of its own session
    create_time: float
    dashboard: str  # http://host:port, what JobSubmissionClient takes
    gcs: str  # host:port, what `ray start --address` takes
    temp_dir: str
    log: str


def pin_auth_mode() -> None:
    """Make our heads and our clients agree on Ray's token authentication. Unset, Ray 2.60
    turns it on for a new head whenever ~/.ray/auth_token exists (any local ray.init() writes
    one) while a client may not send it. Unless the user chose a mode, our heads run without
    tokens, as miles' own `ray start --head` does."""
    os.environ.setdefault(AUTH_MODE_ENV, "disabled")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ray_executable() -> str:
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise RunnerError(
            "the `ray` command is not installed; install ray[default] or use --runner local"
        )
    return found


def dashboard_ready(address: str) -> bool:
    from ray.job_submission import JobSubmissionClient

    try:
        JobSubmissionClient(address).list_jobs()
    except Exception:  # noqa: BLE001 - any failure means "not yet reachable"
        return False
    return True


def head_alive(state: HeadState) -> bool:
    try:
        return psutil.Process(state.pid).create_time() == state.create_time
    except psutil.Error:
        return False


def start_head(
    state_dir: Path,
    host: str = "127.0.0.1",
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    node_name: str | None = None,
    launcher: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    on_spawn: Callable[[HeadState], None] | None = None,
) -> HeadState:
    """Start a head (GPUs/CPUs autodetected unless given) and wait until its dashboard answers.
    `launcher` prefixes the command (e.g. `srun ... --overlap` to run the head as a job step);
    the recorded pid is then the launcher's, and the head dies with it. `env`: the head's
    environment (default: this process's). `on_spawn` gets the head's state as soon as it is
    started, before the wait (to guard or record it). A head that fails to come up, or whose
    start is interrupted (Ctrl-C, SIGTERM), is stopped before this returns or raises."""
    pin_auth_mode()
    state_dir.mkdir(parents=True, exist_ok=True)
    # Ray's unix socket paths must stay short: its temp dir goes under /tmp, not state_dir.
    temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    gcs_port, dash_port = free_port(host), free_port(host)
    cmd = [
        *launcher,
        ray_executable(),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={host}",
        f"--port={gcs_port}",
        "--include-dashboard=true",
        f"--dashboard-host={host}",
        f"--dashboard-port={dash_port}",
        f"--dashboard-agent-listen-port={free_port(host)}",
        f"--ray-client-server-port={free_port(host)}",
        f"--temp-dir={temp_dir}",
    ]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    if node_name:
        cmd.append(f"--node-name={node_name}")
    head_env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    head_env.setdefault(AUTH_MODE_ENV, os.environ[AUTH_MODE_ENV])
    log = state_dir / f"{LOG_PREFIX}{os.getpid()}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=head_env,
        )
    state = HeadState(
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        dashboard=f"http://{host}:{dash_port}",
        gcs=f"{host}:{gcs_port}",
        temp_dir=temp_dir,
        log=str(log),
    )
    try:
        if on_spawn is not None:
            on_spawn(state)
        failure = _wait_ready(proc, state)
    except BaseException:
        stop_head(state)
        raise
    if failure:
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-15:])
        stop_head(state)
        raise RunnerError(f"the Ray head {failure}; its last output:\n{tail}")
    return state


def _wait_ready(proc: subprocess.Popen, state: HeadState, timeout: float = START_TIMEOUT_S) -> str:
    """Wait until the head says it is up and its dashboard answers; return why not (or "").
    A thread waits on the head process, so its death ends the wait at once."""
    died = threading.Event()
    threading.Thread(target=lambda: (proc.wait(), died.set()), daemon=True).start()
    end = time.monotonic() + timeout
    started = False
    while not died.is_set():
        started = started or BLOCKING_LINE in Path(state.log).read_text(errors="replace")
        if started and dashboard_ready(state.dashboard):
            return ""
        if time.monotonic() > end:
            return f"did not come up within {timeout:g} s"
        died.wait(READY_POLL_S)
    return f"exited with status {proc.returncode} while starting"


def stop_head(state: HeadState, grace: float = 15.0) -> None:
    """Stop exactly the processes of this head: its session and process tree (Ray renames its
    workers, `ray::IDLE`, so they are found by ancestry), then anything naming its temp dir.
    A record whose head is gone (its pid dead or reused) touches no process group, and only a
    temp dir and log named as start_head names them are removed."""
    alive = head_alive(state)
    own_temp = Path(state.temp_dir).name.startswith(TEMP_PREFIX)
    tree: list[psutil.Process] = []
    if alive:
        head = psutil.Process(state.pid)
        tree = [head, *head.children(recursive=True)]
        try:
            os.killpg(state.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            psutil.Process(state.pid).wait(timeout=grace)
        except (psutil.TimeoutExpired, psutil.NoSuchProcess):
            pass
    leftovers = [p for p in tree if p.is_running()]
    if own_temp:
        leftovers += [p for p in psutil.process_iter(["cmdline"]) if _names(p, state.temp_dir)]
    for proc in leftovers:
        try:
            proc.kill()
        except psutil.Error:
            continue
    if alive:
        try:
            os.killpg(state.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    psutil.wait_procs(leftovers, timeout=5)
    if own_temp and _ray_used(Path(state.temp_dir)):
        shutil.rmtree(state.temp_dir, ignore_errors=True)
    if Path(state.log).name.startswith(LOG_PREFIX):
        Path(state.log).unlink(missing_ok=True)


def _names(proc: psutil.Process, temp_dir: str) -> bool:
    """Whether a word of the process's command line is the temp dir or a path in it (not a
    longer name that starts with it: /tmp/rv-ray-ab is not /tmp/rv-ray-abc)."""
    cmdline = proc.info.get("cmdline") or []
    return proc.pid != os.getpid() and any(_in_dir(word, temp_dir) for word in cmdline)


def _in_dir(word: str, folder: str) -> bool:
    start = word.find(folder)
    while start >= 0:
        before = word[start - 1] if start else ""
        after = word[start + len(folder) : start + len(folder) + 1]
        if before in ("", "=", "'", '"', " ") and after in ("", "/", "'", '"', " "):
            return True
        start = word.find(folder, start + 1)
    return False


def _ray_used(path: Path) -> bool:
    """A folder Ray's head could have made its temp dir: empty, or holding Ray's sessions."""
    if not path.is_dir() or path.is_symlink():
        return False
    entries = [entry.name for entry in path.iterdir()]
    return not entries or any(name.startswith("session_") for name in entries)


class HeadRecordError(ValueError):
    """A head record (head.json, head.lock) that recipeval did not write as it stands: nothing
    it names is stopped or removed."""


class _HeadRecord(BaseModel, strict=True):
    pid: int = Field(gt=0, le=PID_MAX)
    create_time: float
    dashboard: str
    gcs: str
    temp_dir: str
    log: str


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        with locked_file(state_dir / "head.lock"):
            yield
    except NotRegularFile as err:
        raise HeadRecordError(f"{err.filename}: {err.strerror}") from None


def read_state(state_dir: Path) -> HeadState | None:
    """The recorded head, or None without a record. HeadRecordError for a record start_head
    did not write as it stands (not JSON, wrong types, a FIFO, a temp dir or log named
    otherwise than start_head names them)."""
    path = state_dir / STATE_FILE
    try:
        raw = read_regular(path, limit=RECORD_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise HeadRecordError(f"{path}: {unreadable_reason(err)}") from None
    try:
        state = HeadState(**_HeadRecord.model_validate_json(raw).model_dump())
    except ValidationError as err:
        raise HeadRecordError(f"{path}: {unreadable_reason(err)}") from None
    temp_dir, log = Path(state.temp_dir), Path(state.log)
    if not temp_dir.is_absolute() or not temp_dir.name.startswith(TEMP_PREFIX):
        raise HeadRecordError(f"{path}: temp_dir {state.temp_dir!r} is not a head's temp dir")
    if log.parent.resolve() != state_dir.resolve() or not log.name.startswith(LOG_PREFIX):
        raise HeadRecordError(f"{path}: log {state.log!r} is not a head's log in {state_dir}")
    return state


def _write_state(state_dir: Path, state: HeadState) -> None:
    atomic_write_text(state_dir / STATE_FILE, json.dumps(asdict(state), indent=2))


def shared_head(state_dir: Path) -> HeadState:
    """The pipeline run's head: reuse the recorded one when it is alive, else start one."""
    pin_auth_mode()
    with locked(state_dir):
        try:
            state = read_state(state_dir)
        except HeadRecordError:
            state = None  # touch nothing it names; the new head's record replaces it
        if state is not None and head_alive(state) and dashboard_ready(state.dashboard):
            return state
        if state is not None:
            stop_head(state)
        # recorded from its start, so `ray-down` finds a head whose starter was killed
        try:
            return start_head(state_dir, on_spawn=lambda spawned: _write_state(state_dir, spawned))
        except BaseException:
            (state_dir / STATE_FILE).unlink(missing_ok=True)
            raise


def shared_head_down(state_dir: Path) -> Literal["stopped", "stale", "none"]:
    """Stop the recorded head of state_dir: "stopped"; "stale" when the record names a head
    that is no longer running (the record is removed); "none" without a record."""
    if not state_dir.is_dir():
        return "none"
    with locked(state_dir):
        state = read_state(state_dir)
        if state is None:
            return "none"
        alive = head_alive(state)
        stop_head(state)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        return "stopped" if alive else "stale"
