"""Run a launch as a local subprocess in its own process group (and session).

Stopping sends SIGTERM to the group, waits, then SIGKILLs it. Processes that left the group
(setsid, daemonising) are found because their ids are recorded while the job runs; every one
still alive at the end is killed too, so a timed-out job leaves nothing behind. A watchdog
process (watchdog.py) kills the job if this process dies without cleaning up (kill -9).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil

from recipeval.engines.launch import Launch, write_runtime_env
from recipeval.runners.base import (
    POLL_S,
    STOP_GRACE_S,
    Deadline,
    LineSink,
    Runner,
    RunnerError,
    RunResult,
    start_watchdog,
)


class ProcessTree:
    """The job's processes: its group plus every descendant ever seen (pid, create time)."""

    def __init__(self, leader: subprocess.Popen) -> None:
        self.leader = leader
        self.pgid = leader.pid  # start_new_session makes the leader its group's leader
        self.seen: dict[int, float] = {}

    def record(self) -> None:
        try:
            procs = [psutil.Process(self.leader.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            return
        for proc in procs:
            try:
                self.seen.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                continue

    def alive(self) -> list[psutil.Process]:
        out = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in self.alive():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                continue

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return any(_in_group(p, self.pgid) for p in psutil.process_iter())

    def terminate(self, grace: float) -> None:
        """SIGTERM everything, wait up to `grace` seconds, SIGKILL what is left, reap."""
        self.record()
        self.signal(signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            self.leader.poll()
            if not self.alive() and not self.group_alive():
                break
            time.sleep(0.05)
        self.signal(signal.SIGKILL)
        self.leader.wait()
        psutil.wait_procs(self.alive(), timeout=5)


def _in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ProcessLookupError, PermissionError):
        return False


class LocalRunner(Runner):
    name = "local"

    def __init__(self, grace: float = STOP_GRACE_S) -> None:
        self.grace = grace

    def run(
        self,
        launch: Launch,
        on_line: LineSink,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> RunResult:
        env = {**os.environ, **launch.env, **launch.client_env}
        try:
            env_file = write_runtime_env(launch)
        except OSError as err:
            raise RunnerError(f"cannot write the runtime env file: {err}") from err
        try:
            return self._run(launch, env, on_line, timeout, stop)
        finally:
            if env_file is not None:  # it holds every env value; Ray read it at submission
                env_file.unlink(missing_ok=True)

    def _run(
        self,
        launch: Launch,
        env: dict[str, str],
        on_line: LineSink,
        timeout: float | None,
        stop: threading.Event | None,
    ) -> RunResult:
        started = time.time()
        try:
            proc = subprocess.Popen(
                launch.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as err:
            raise RunnerError(f"cannot start {launch.argv[0]!r}: {err}") from err
        try:
            watchdog = start_watchdog(str(proc.pid))
        except OSError as err:
            ProcessTree(proc).terminate(0.0)
            raise RunnerError(f"cannot start the watchdog that guards the job: {err}") from err
        try:
            return self._follow(proc, on_line, timeout, stop, started)
        finally:
            watchdog.kill()
            watchdog.wait()

    def _follow(
        self,
        proc: subprocess.Popen,
        on_line: LineSink,
        timeout: float | None,
        stop: threading.Event | None,
        started: float,
    ) -> RunResult:
        tree = ProcessTree(proc)
        deadline = Deadline(timeout)
        timed_out = stopped = False
        try:  # from here on, any way out (Ctrl-C, Terminated) takes the job down first
            reader = threading.Thread(target=_pump, args=(proc, on_line), daemon=True)
            reader.start()
            while proc.poll() is None:
                if deadline.passed():
                    timed_out = True
                    break
                if stop is not None and stop.is_set():
                    stopped = True
                    break
                tree.record()
                time.sleep(POLL_S)
        except BaseException:  # Ctrl-C or Terminated: the job must not outlive us
            tree.terminate(self.grace)
            raise
        exit_code = proc.returncode
        # Also after a clean exit: whatever the job left running in its group is the job's.
        tree.terminate(self.grace if exit_code is None else 1.0)
        reader.join(timeout=5)
        detail = ""
        if timed_out:
            detail = f"timed out after {timeout:g} s; process group {tree.pgid} killed"
        elif stopped:
            detail = "stopped on request"
        elif exit_code is not None and exit_code < 0:
            detail = f"killed by signal {signal.Signals(-exit_code).name}"
        elif exit_code:
            detail = f"exited with status {exit_code}"
        return RunResult(
            exit_code=exit_code,
            started=started,
            finished=time.time(),
            timed_out=timed_out,
            stopped=stopped,
            detail=detail,
        )


def _pump(proc: subprocess.Popen, on_line: LineSink) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        on_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    proc.stdout.close()
