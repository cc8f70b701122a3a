"""Kill a local job when the recipeval process that started it dies, SIGKILL included.

The local runner starts this file as a script (by path, so it imports nothing of recipeval and
is watching within a few tenths of a second) in a session of its own, so a signal to
recipeval's process group does not reach it. It polls its parent; once the parent is gone
(getppid() changes when the orphan is re-parented), it SIGKILLs the job's process group and
every descendant of the job it has seen, including ones that left the group.

Why not prctl(PR_SET_PDEATHSIG) on the job: it fires when the parent *thread* that forked the
job exits (not the process), and it only reaches the job's first process, not the children
that miles, Ray or a shell start.

Usage: python watchdog.py PARENT_PID LEADER_PID
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

POLL_S = 0.2


def _descendants(leader: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(leader)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def watch(parent: int, leader: int) -> None:
    """Return after the job was killed because `parent` died."""
    seen: dict[int, float] = {}
    while os.getppid() == parent:
        for proc in _descendants(leader):
            try:
                seen.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                continue
        time.sleep(POLL_S)
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


def main(argv: list[str]) -> int:
    parent, leader = int(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is recipeval's to handle
    watch(parent, leader)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
