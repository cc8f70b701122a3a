"""Run a launch as a Ray job through the Jobs API (`JobSubmissionClient`).

Address: RAY_ADDRESS when set (a dashboard address such as http://head:8265), else an
embedded head this runner starts (see ray_head: private, or shared through
RECIPEVAL_RAY_STATE_DIR). The Jobs API runs `entrypoint` through a shell, so the entrypoint
string is built with every word quoted (shlex.join): a recipe value is never shell text.
Watchdog processes (watchdog.py) stop the job, and a private head from the moment it starts,
if this process is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from recipeval.engines.launch import Launch
from recipeval.runners import ray_head
from recipeval.runners.base import (
    POLL_S,
    STOP_GRACE_S,
    Deadline,
    LineBuffer,
    LineSink,
    Runner,
    RunnerError,
    RunResult,
    node_gpus,
    start_watchdog,
)

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
AGENT_WAIT_S = 180.0
STATE_API_TIMEOUT_S = 10


def entrypoint_command(words: list[str]) -> str:
    """The shell command the Jobs API runs: each word quoted, so `$(x)`, `;`, quotes stay data."""
    return shlex.join(words)


def cluster_gpus(address: str) -> str | None:
    """The accelerator types Ray detected on the cluster's alive nodes (its
    `accelerator_type:X` resources, e.g. "H100", "AMD-Instinct-MI355X-OAM"; distinct, sorted,
    ", "-joined), or None when it lists none or cannot be asked."""
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(
            address=address,
            filters=[("state", "=", "ALIVE")],
            timeout=STATE_API_TIMEOUT_S,
            raise_on_missing_output=False,
        )
    except Exception:  # noqa: BLE001 - the card is provenance; not knowing it fails no run
        return None
    prefix = "accelerator_type:"
    names = {
        key.removeprefix(prefix)
        for node in nodes
        for key in (node.resources_total or {})
        if key.startswith(prefix)
    }
    return ", ".join(sorted(names)) or None


class RayRunner(Runner):
    name = "ray"

    def __init__(self, address: str | None = None, grace: float = STOP_GRACE_S) -> None:
        self.grace = grace
        self._private_head: ray_head.HeadState | None = None
        self._shared_head: ray_head.HeadState | None = None
        self._head_watchdog: subprocess.Popen | None = None
        self.address = address or os.environ.get("RAY_ADDRESS") or self._embedded_address()

    def _embedded_address(self) -> str:
        state_dir = os.environ.get(ray_head.STATE_DIR_ENV)
        if state_dir:
            self._shared_head = ray_head.shared_head(Path(state_dir))
            return self._shared_head.dashboard
        private_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"recipeval-ray-{os.getuid()}"
        try:
            self._private_head = ray_head.start_head(private_dir, on_spawn=self._guard_head)
        except BaseException:  # start_head stopped the head; its guard has nothing left to do
            self._unguard_head()
            raise
        return self._private_head.dashboard

    def _guard_head(self, head: ray_head.HeadState) -> None:
        """A watchdog that stops the private head if this process is killed (kill -9), from
        its first second: the head can take minutes to answer, and its start is no job yet."""
        try:
            self._head_watchdog = start_watchdog("--ray-head", json.dumps(asdict(head)))
        except OSError as err:
            raise RunnerError(f"cannot start the watchdog that guards the Ray head: {err}") from err

    def _unguard_head(self) -> None:
        if self._head_watchdog is not None:
            self._head_watchdog.kill()
            self._head_watchdog.wait()
            self._head_watchdog = None

    def describe(self) -> dict[str, object]:
        own = self._private_head or self._shared_head
        head = "private" if self._private_head else "shared" if self._shared_head else "external"
        return {
            "runner": self.name,
            "address": self.address,
            "head": head,
            "ray_temp_dir": own.temp_dir if own else None,
            # A head started here runs the job here; an external cluster says what Ray found.
            "gpu": node_gpus() if own else cluster_gpus(self.address),
        }

    def close(self) -> None:
        if self._private_head is not None:
            ray_head.stop_head(self._private_head)
            self._private_head = None
        self._unguard_head()

    def run(
        self,
        launch: Launch,
        on_line: LineSink,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> RunResult:
        from ray.job_submission import JobSubmissionClient

        try:
            client = JobSubmissionClient(self.address)
        except Exception as err:
            raise RunnerError(f"cannot reach the Ray dashboard at {self.address}: {err}") from err
        started = time.time()
        job_id = _submit(
            client,
            entrypoint=entrypoint_command(launch.entrypoint),
            runtime_env=launch.runtime_env,
            submission_id=f"recipeval-{launch.stage or 'run'}-{uuid.uuid4().hex[:8]}",
        )
        watchdog = self._watch(job_id)
        lines = LineBuffer(on_line)
        tail = threading.Thread(target=_tail, args=(client, job_id, lines), daemon=True)
        tail.start()
        deadline = Deadline(timeout)
        timed_out = stopped = False
        try:
            status = str(client.get_job_status(job_id))
            while _name(status) not in TERMINAL:
                if deadline.passed() or (stop is not None and stop.is_set()):
                    timed_out, stopped = deadline.passed(), not deadline.passed()
                    status = self._stop(client, job_id)
                    break
                time.sleep(POLL_S)
                status = str(client.get_job_status(job_id))
        except BaseException:  # Ctrl-C or Terminated: stop the job before leaving
            self._stop(client, job_id)
            raise
        finally:
            watchdog.kill()
            watchdog.wait()
        tail.join(timeout=10)
        _catch_up(client, job_id, lines)
        info = client.get_job_info(job_id)
        exit_code = info.driver_exit_code
        if exit_code is None and _name(status) == "SUCCEEDED":
            exit_code = 0
        detail = ""
        if timed_out:
            detail = f"timed out after {timeout:g} s; Ray job {job_id} stopped ({_name(status)})"
        elif stopped:
            detail = f"stopped on request; Ray job {job_id} {_name(status)}"
        elif _name(status) != "SUCCEEDED":
            detail = f"Ray job {job_id} {_name(status)}: {info.message or ''}".strip()
        return RunResult(
            exit_code=None if (timed_out or stopped) else exit_code,
            started=started,
            finished=time.time(),
            timed_out=timed_out,
            stopped=stopped,
            detail=detail,
        )

    def _watch(self, job_id: str) -> subprocess.Popen:
        """A watchdog that stops the job if this process is killed without a chance to do it
        itself (kill -9); a private head has its own (_guard_head)."""
        try:
            return start_watchdog("--ray-job", self.address, job_id)
        except OSError as err:
            from ray.job_submission import JobSubmissionClient

            JobSubmissionClient(self.address).stop_job(job_id)
            raise RunnerError(f"cannot start the watchdog that guards the job: {err}") from err

    def _stop(self, client, job_id: str) -> str:
        client.stop_job(job_id)  # SIGTERM to the entrypoint, SIGKILL after Ray's own wait
        end = time.monotonic() + self.grace + 10
        status = str(client.get_job_status(job_id))
        while _name(status) not in TERMINAL and time.monotonic() < end:
            time.sleep(POLL_S)
            status = str(client.get_job_status(job_id))
        return status


def _submit(client, **job: object) -> str:
    """Submit; a fresh head answers before its job agent is up, so retry that case a while."""
    end = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.monotonic() > end:
                raise RunnerError(f"Ray refused the job: {err}") from err
            time.sleep(1.0)


def _name(status: object) -> str:
    return str(getattr(status, "value", status)).rsplit(".", 1)[-1]


def _tail(client, job_id: str, lines: LineBuffer) -> None:
    async def follow() -> None:
        async for chunk in client.tail_job_logs(job_id):
            lines.feed(chunk)

    try:
        asyncio.run(follow())
    except Exception:  # noqa: BLE001 - a broken tail is repaired by _catch_up
        return


def _catch_up(client, job_id: str, lines: LineBuffer) -> None:
    """After the job ended, take whatever the live tail missed (including a last line without
    newline) from the stored job log; fall back to what the tail buffered."""
    try:
        stored: str | None = client.get_job_logs(job_id)
    except Exception:  # noqa: BLE001
        stored = None
    if stored is None:
        lines.flush()
        lines.close()
        return
    lines.close()
    all_lines = stored.split("\n")
    if all_lines and all_lines[-1] == "":
        all_lines.pop()
    for line in all_lines[lines.emitted :]:
        lines.emit(line)


__all__ = ["RayRunner", "RunnerError", "entrypoint_command"]
