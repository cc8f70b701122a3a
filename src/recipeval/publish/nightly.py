"""`recipeval nightly`: rerun every selected recipe's DAG from scratch with the environment
of tonight, then turn the published verdict into an exit status.

A scheduler or CI runner stops a job with SIGTERM, which Snakemake takes as "finish the
running jobs first": cluster jobs would run on for hours after the nightly was stopped. The
nightly passes SIGTERM (and SIGHUP, and SIGINT) on as SIGINT to snakemake's process group, on
which Snakemake cancels its cluster jobs (scancel), its local jobs stop, and it exits. When the
nightly itself is killed (kill -9), a watchdog sends that SIGINT, and SIGKILL after
CANCEL_GRACE_S if snakemake is still running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from recipeval.exit_codes import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_FAIL, EXIT_OK, FAILING_VERDICTS
from recipeval.runners.base import start_watchdog

# How long snakemake has to cancel its jobs once the nightly died, before it is killed.
CANCEL_GRACE_S = 60.0
# argparse's exit status for an option snakemake does not take or a value not among its choices;
# snakemake itself exits 1 on every other failure (a bad --cores value included, which is why
# the nightly command checks --cores itself).
SNAKEMAKE_USAGE_ERROR = 2


def snakemake_argv(profiles: list[str], cores: str | None, extra: list[str]) -> list[str]:
    # --forceall: the recipes may be unchanged while the trainer stack moved (miles #2040),
    # so every stage runs again; the history is not a Snakemake output and is kept.
    argv = [sys.executable, "-m", "snakemake", "--forceall"]
    for profile in profiles:
        argv += ["--profile", profile]
    if cores:
        argv += ["--cores", cores]
    return argv + extra


class VerdictError(Exception):
    """A fresh verdict file that is not publish's verdict: no status can be read from it."""


def read_verdict(path: Path, not_before: float) -> dict | None:
    """The verdict publish wrote during this run, or None (publish did not run); VerdictError
    when it cannot be read as publish writes it (a recipe list with a name and a status each)."""
    if not path.is_file() or path.stat().st_mtime < not_before:
        return None
    try:
        verdict = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise VerdictError(f"{path}: {err}") from None
    recipes = verdict.get("recipes") if isinstance(verdict, dict) else None
    if not isinstance(recipes, list) or not all(
        isinstance(r, dict)
        and isinstance(r.get("recipe"), str)
        and isinstance(r.get("status"), str)
        for r in recipes
    ):
        raise VerdictError(f"{path}: not a verdict: expected recipes, each with recipe and status")
    return verdict


def _default_sigint() -> None:
    """In the snakemake child: SIGINT at its default, whatever we inherited. A command that a
    non-interactive shell starts in the background (cron lines, CI steps with `&`) inherits
    SIGINT ignored, Python then never raises KeyboardInterrupt, and snakemake would shrug off
    the SIGINT this module sends as its cancel."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cancellable(argv: list[str]) -> tuple[int, int | None]:
    """Run snakemake in a process group of its own. SIGTERM and SIGHUP to this process (and
    SIGINT, unless we ignore it) reach that whole group as SIGINT, as Ctrl-C in a terminal
    does: snakemake cancels its cluster jobs, and its local jobs, which would otherwise keep
    it waiting, stop too. Returns its exit status and the signal that stopped us, if one did."""
    stopped_by: list[int] = []
    group: list[int] = []

    def cancel(signum: int, frame: FrameType | None) -> None:
        if not stopped_by:
            print(
                f"recipeval nightly: {signal.Signals(signum).name}: cancelling snakemake's jobs",
                file=sys.stderr,
                flush=True,
            )
        stopped_by.append(signum)
        for pgid in group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGINT)

    forwarded = [signal.SIGTERM, signal.SIGHUP]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        forwarded.append(signal.SIGINT)
    previous = {sig: signal.signal(sig, cancel) for sig in forwarded}
    try:
        # preexec_fn is unsafe with threads; the nightly has none.
        proc = subprocess.Popen(argv, preexec_fn=_default_sigint, process_group=0)  # noqa: PLW1509
        group.append(proc.pid)
        # kill -9 of this process leaves no handler to pass the cancel on: the watchdog does
        watchdog = start_watchdog(str(proc.pid), "--interrupt", str(CANCEL_GRACE_S))
        try:
            if stopped_by:  # a signal came while it started
                cancel(stopped_by[0], None)
            returncode = proc.wait()
        finally:
            watchdog.kill()
            watchdog.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return returncode, (stopped_by[0] if stopped_by else None)


def nightly(profiles: list[str], cores: str | None, verdict_path: Path, extra: list[str]) -> int:
    started = time.time()
    returncode, stopped_by = run_cancellable(snakemake_argv(profiles, cores, extra))
    if stopped_by is not None:
        print(
            f"recipeval nightly: stopped by {signal.Signals(stopped_by).name} (snakemake exit "
            f"{returncode}); no verdict",
            file=sys.stderr,
        )
        return 128 + stopped_by
    try:
        verdict = read_verdict(verdict_path, started)
    except VerdictError as err:
        print(f"recipeval nightly: unusable verdict at {err}", file=sys.stderr)
        return EXIT_ERROR
    if verdict is None and returncode == SNAKEMAKE_USAGE_ERROR:
        print(
            "recipeval nightly: snakemake refused its command line (exit 2, the reason is "
            "above); nothing ran",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if verdict is None:
        print(
            f"recipeval nightly: no fresh verdict at {verdict_path} (snakemake exit {returncode})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    bad = [r for r in verdict["recipes"] if r["status"] in FAILING_VERDICTS]
    for rec in verdict["recipes"]:
        print(f"{rec['status']:9} {rec['recipe']}")
    if returncode != 0:
        print(f"recipeval nightly: snakemake exited {returncode}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_FAIL if bad else EXIT_OK
