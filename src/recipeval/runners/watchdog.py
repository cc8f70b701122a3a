"""Stop a job when the recipeval process that started it dies, SIGKILL included.

A runner starts this file as a script (by path, so it imports nothing of recipeval and is
watching within a few tenths of a second) in a session of its own, so a signal to recipeval's
process group does not reach it. It polls its parent; once the parent is gone (getppid()
changes when the orphan is re-parented), it cleans up:

- a local job: SIGKILL to the job's process group and every descendant of the job it has
  seen, including ones that left the group;
- a Ray job: the job stopped through the Jobs API;
- a Ray head the runner started for itself (its state given as JSON): stopped with everything
  it started, guarded from the moment it is spawned, since it can take minutes to come up.

Why not prctl(PR_SET_PDEATHSIG) on the job: it fires when the parent *thread* that forked the
job exits (not the process), and it only reaches the job's first process, not the children
that miles, Ray or a shell start.

Usage: python watchdog.py PARENT_PID LEADER_PID [--interrupt GRACE_S]
       python watchdog.py PARENT_PID --ray-job ADDRESS JOB_ID
       python watchdog.py PARENT_PID --ray-head HEAD_STATE_JSON
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable

import psutil

POLL_S = 0.2


def _descendants(leader: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(leader)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def wait_for_parent_death(parent: int, while_waiting: Callable[[], None] = lambda: None) -> None:
    while os.getppid() == parent:
        while_waiting()
        time.sleep(POLL_S)


def kill_local_job(parent: int, leader: int, interrupt_grace: float | None = None) -> None:
    """Return after the job was killed because `parent` died. With `interrupt_grace`, its
    group first gets SIGINT and that many seconds to end (snakemake then cancels its own jobs,
    cluster jobs included), and SIGKILL only if it is still there."""
    seen: dict[int, float] = {}

    def remember() -> None:
        for proc in _descendants(leader):
            try:
                seen.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                continue

    wait_for_parent_death(parent, remember)
    if interrupt_grace is not None:
        with contextlib.suppress(OSError):
            os.killpg(leader, signal.SIGINT)
        with contextlib.suppress(psutil.Error):
            psutil.Process(leader).wait(timeout=interrupt_grace)
    try:
        os.killpg(leader, signal.SIGKILL)  # the leader's pid is its group's id (new session)
    except OSError:
        pass
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.kill()
        except psutil.Error:
            continue


def stop_ray_head(parent: int, head: str) -> None:
    """Return after the head (its state as JSON) was stopped, with every process it started,
    because `parent` died. recipeval is imported only then: the watch must start fast."""
    wait_for_parent_death(parent)
    from recipeval.runners.ray_head import HeadState, stop_head

    stop_head(HeadState(**json.loads(head)))


def stop_ray_job(parent: int, address: str, job_id: str) -> None:
    """Return after the Ray job was stopped because `parent` died. Ray is imported only then."""
    wait_for_parent_death(parent)
    from ray.job_submission import JobSubmissionClient

    # The head may be gone too, and then there is nothing left to stop.
    with contextlib.suppress(Exception):
        JobSubmissionClient(address).stop_job(job_id)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is recipeval's to handle
    parent = int(argv[1])
    if argv[2] == "--ray-job":
        stop_ray_job(parent, argv[3], argv[4])
    elif argv[2] == "--ray-head":
        stop_ray_head(parent, argv[3])
    else:
        grace = float(argv[4]) if len(argv) > 4 and argv[3] == "--interrupt" else None
        kill_local_job(parent, int(argv[2]), grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
