"""The runner interface: execute a rendered Launch, hand its output to the caller line by line,
stop it on timeout or on request, and say how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from recipeval.engines.launch import Launch

LineSink = Callable[[str], None]

# How long a job gets between the polite stop (SIGTERM / stop_job) and the hard one.
STOP_GRACE_S = 10.0
POLL_S = 0.2


class RunnerError(Exception):
    """The runner could not start or follow the job (not the job's own failure)."""


@dataclass
class RunResult:
    exit_code: int | None  # None: the job never reported one (lost, or stopped before exiting)
    started: float  # epoch seconds
    finished: float
    timed_out: bool = False
    stopped: bool = False  # stopped on request (e.g. the bench had enough steps)
    detail: str = ""  # how it ended, in words, when that is not plain exit 0

    @property
    def wall_s(self) -> float:
        return self.finished - self.started

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Runner(ABC):
    """One job at a time. `run` blocks until the job ended or was stopped; `on_line` gets each
    output line (without newline) in order, from a worker thread; setting `stop` asks for a
    stop (the result then has stopped=True)."""

    name: str

    @abstractmethod
    def run(
        self,
        launch: Launch,
        on_line: LineSink,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> RunResult: ...

    def describe(self) -> dict[str, object]:
        """Where jobs run, for the stage summary (e.g. Ray address, nodes, GPUs); `gpu` is the
        card the job ran on, where the runner runs it on this node."""
        return {"runner": self.name, "gpu": node_gpus()}

    def close(self) -> None:
        """Release what the runner started for itself (e.g. a private Ray head)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# libdrm's table of AMD marketing names by PCI device and revision id (what amd-smi calls the
# market name, and HIP the device name); ROCm installs its own copy under /opt/amdgpu.
AMDGPU_IDS = ("usr/share/libdrm/amdgpu.ids", "opt/amdgpu/share/libdrm/amdgpu.ids")
AMD_VENDOR_ID = "0x1002"


def node_gpus(root: Path = Path("/")) -> str | None:
    """The GPU models this node's drivers list (distinct, sorted, ", "-joined; None: none),
    read from the driver's files, so it costs no torch import and no subprocess: NVIDIA's
    /proc/driver/nvidia/gpus/*/information ("Model:" line); for an AMD card (PCI vendor
    0x1002 under /sys/class/drm), its marketing name from libdrm's amdgpu.ids, else the
    board's product_name (a board name can drop the model's suffix: "AMD Instinct MI350 OAM"
    on an MI350X). The card a run used is what tells a slower night on another card from a
    regression; the recipe only says what it expects."""
    names = set()
    for info in sorted(root.glob("proc/driver/nvidia/gpus/*/information")):
        for line in _read(info).splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                names.add(value.strip())
    marketing = _amdgpu_marketing_names(root)
    for device in sorted(root.glob("sys/class/drm/card*/device")):
        if _read(device / "vendor").strip().lower() != AMD_VENDOR_ID:
            continue  # a server's BMC display, another vendor's card
        pci_id = (_hex_id(device / "device"), _hex_id(device / "revision"))
        name = marketing.get(pci_id) or _read(device / "product_name").strip()
        if name:
            names.add(name)
    return ", ".join(sorted(names)) or None


def _amdgpu_marketing_names(root: Path) -> dict[tuple[str, str], str]:
    """(device id, revision id) -> name from the first amdgpu.ids there is ("75A3,\t00,\tAMD
    Instinct MI355X" lines; ids as upper-case hex without 0x)."""
    for table in AMDGPU_IDS:
        text = _read(root / table)
        if text:
            return {
                (fields[0].strip().upper(), fields[1].strip().upper()): fields[2].strip()
                for line in text.splitlines()
                if not line.startswith("#") and len(fields := line.split(",", 2)) == 3
            }
    return {}


def _hex_id(path: Path) -> str:
    """A sysfs PCI id ("0x75a3") as amdgpu.ids writes it ("75A3")."""
    return _read(path).strip().upper().removeprefix("0X")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


class Deadline:
    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


class LineBuffer:
    """Turns text chunks (Ray's log tail) into whole lines; `flush` hands over a last line
    that never got its newline (a killed run)."""

    def __init__(self, sink: LineSink) -> None:
        self.sink = sink
        self.pending = ""
        self.emitted = 0
        self.closed = False
        self.lock = threading.Lock()

    def feed(self, chunk: str) -> None:
        with self.lock:
            if self.closed:
                return
            self.pending += chunk
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                self.emit(line)

    def close(self) -> None:
        """Ignore further chunks (a tail that outlived the job); pending text is dropped."""
        with self.lock:
            self.closed = True
            self.pending = ""

    def emit(self, line: str) -> None:
        self.sink(line.rstrip("\r"))
        self.emitted += 1

    def flush(self) -> None:
        if self.pending:
            self.emit(self.pending)
            self.pending = ""


class Terminated(SystemExit):
    """This process got SIGTERM/SIGHUP (Snakemake or Slurm cancelling the stage): runners stop
    their job on the way out, as for Ctrl-C, and the process exits 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)


@contextmanager
def stop_job_on_termination() -> Iterator[None]:
    """While a job runs, turn SIGTERM/SIGHUP into Terminated (SIGINT already raises
    KeyboardInterrupt), so the runner's cleanup runs: a local job lives in its own session and
    would not get the signal itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        # One is enough: a second signal must not interrupt the cleanup the first one started.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        print(f"recipeval: got {signal.Signals(signum).name}, stopping the job", file=sys.stderr)
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except KeyboardInterrupt:  # said once the runner's cleanup has run, which Ctrl-C started
        print("recipeval: got SIGINT, the job was stopped", file=sys.stderr)
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


WATCHDOG = Path(__file__).with_name("watchdog.py")


def start_watchdog(*job: str) -> subprocess.Popen:
    """The process that stops the job if this one dies, kill -9 included (see watchdog.py for
    `job`'s forms): its own session, so a signal to our group leaves it to do its work. Kill it
    once the job is over."""
    return subprocess.Popen(
        [sys.executable, "-I", str(WATCHDOG), str(os.getpid()), *job],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
