"""`python -m recipeval.reference <flags>`: the command the launcher renders.

Exit codes: 0 done, 1 the non-colocated rollout process died (one line saying how), 2 bad
flags (one line naming the flag), 143 stopped by SIGTERM (130 by SIGINT) after closing the
partial dump and stopping its Ray actors or rollout process."""

from __future__ import annotations

import signal
import sys
from types import FrameType


class Stopped(BaseException):
    """Raised in the main thread by a termination signal, so `finally` blocks clean up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    from recipeval.reference.config import ConfigError, parse_args

    try:
        config = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"python -m recipeval.reference: error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGINT, _raise_stopped)
    from recipeval.reference.loop import run
    from recipeval.reference.noncolocated import RolloutWorkerFailed

    try:
        run(config)
    except ConfigError as exc:
        print(f"python -m recipeval.reference: error: {exc}", file=sys.stderr)
        return 2
    except RolloutWorkerFailed as exc:
        print(f"python -m recipeval.reference: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Stopped as stop:
        print(f"reference engine: stopped by {stop}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
