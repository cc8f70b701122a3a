"""Non-colocated mode (miles without `--colocate`): the trainer stays in the driver process
(rank 0) and the rollout worker runs in a spawned process of its own (rank 1) on its own
device. Requests and rollout batches travel over a pipe; the weights travel through
torch.distributed (weightsync.py) after each training step. The driver polls the rollout
process while it waits, so a rollout process that dies fails the run with a message naming it
instead of leaving the driver waiting."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from recipeval.reference.config import EngineConfig
from recipeval.reference.dump import Responses
from recipeval.reference.logfmt import MAIN
from recipeval.reference.modeling import build_model, placement
from recipeval.reference.rollout import RolloutBatch, RolloutWorker
from recipeval.reference.trainer import Trainer, TrainResult
from recipeval.reference.weightsync import (
    ROLLOUT_RANK,
    TRAINER_RANK,
    backend_for,
    check_layout,
    join_group,
    layout,
    leave_group,
    receive_weights,
    send_weights,
)

logger = logging.getLogger(MAIN)
POLL_S = 0.2  # how often the driver looks at the rollout process while waiting for it
CLOSE_WAIT_S = 30.0
EXIT_WAIT_S = 5.0


class RolloutWorkerFailed(RuntimeError):
    """The rollout process died or raised; the message says which, with its exit code."""


def rollout_process(config: EngineConfig, device: str, rendezvous: str, conn: Connection) -> None:
    """The rollout worker's process: serve the driver's requests until it says close (or its
    end of the pipe closes because the driver is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops it, after its own cleanup
    try:
        _serve(config, torch.device(device), Path(rendezvous), conn)
    except EOFError:
        pass  # the driver is gone: nothing left to serve
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which fails the run
        traceback.print_exc()
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    finally:
        leave_group()


def _serve(config: EngineConfig, device: torch.device, rendezvous: Path, conn: Connection) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the decoder's streams and CUDA graphs use the current one
    # The seeded init only gives the tensors their shapes: the first broadcast replaces it.
    state = build_model(config.model, config.seed, "sdpa").state_dict()
    worker = RolloutWorker(config, state, device)
    buffers = {name: torch.empty_like(tensor, device=device) for name, tensor in state.items()}
    conn.send(("ready",))
    join_group(rendezvous, ROLLOUT_RANK, device, config.weight_sync_timeout)
    check_layout(layout(state))
    while True:
        request = conn.recv()
        if request[0] == "generate":
            conn.send(("batch", worker.generate(request[1], request[2])))
        elif request[0] == "sync":
            receive_weights(buffers.values())
            worker.load_weights(buffers)
            conn.send(("synced",))
        elif request[0] == "weights":
            conn.send(("weights", {k: v.to("cpu") for k, v in worker.model.state_dict().items()}))
        elif request[0] == "close":
            return
        else:
            raise ValueError(f"unknown request {request[0]!r}")


class DistributedWorkers:
    """The trainer here, the rollout worker in its own process; weights by broadcast."""

    def __init__(self, config: EngineConfig, state: dict[str, torch.Tensor]) -> None:
        trainer_device, rollout_device = placement(config)
        if trainer_device.type == "cuda":
            torch.cuda.set_device(trainer_device)
        self.trainer = Trainer(config, state, trainer_device)
        self._folder = Path(tempfile.mkdtemp(prefix="recipeval-weightsync-"))
        context = torch.multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=rollout_process,
            args=(config, str(rollout_device), str(self._folder / "rendezvous"), child_conn),
            name="rollout-worker",
        )
        self._in_group = False
        self._waiting = False
        self._process.start()
        child_conn.close()
        try:
            self._expect("start-up")
            rendezvous = self._folder / "rendezvous"
            self._collective(
                "the rendezvous",
                lambda: join_group(
                    rendezvous, TRAINER_RANK, trainer_device, config.weight_sync_timeout
                ),
            )
            self._in_group = True
            self._collective(
                "the layout check", lambda: check_layout(layout(self.trainer.weights()))
            )
            self.sync_weights()  # the rollout worker starts from the trainer's weights
        except BaseException:
            self.close()
            raise
        logger.info(
            f"non-colocated: trainer on {trainer_device}, rollout worker (pid "
            f"{self._process.pid}) on {rollout_device}, weights broadcast over "
            f"{backend_for(trainer_device)}"
        )

    def generate(self, rollout_id: int, given: Responses | None = None) -> RolloutBatch:
        self._send(("generate", rollout_id, given), f"rollout {rollout_id}")
        return self._expect(f"rollout {rollout_id}")[1]

    def train(self, batch: RolloutBatch) -> TrainResult:
        return self.trainer.train(batch)

    def sync_weights(self) -> None:
        self._send(("sync",), "the weight broadcast")
        self._collective(
            "the weight broadcast", lambda: send_weights(self.trainer.weights().values())
        )
        self._expect("the weight broadcast")

    def log_perf(self, rollout_id: int, update_weights_time: float) -> dict[str, float]:
        return self.trainer.log_perf(rollout_id, update_weights_time)

    def rollout_weights(self) -> dict[str, torch.Tensor]:
        """The rollout worker's own weights as it samples with them (CPU copies), to compare
        with the trainer's."""
        self._send(("weights",), "the weights read-back")
        return self._expect("the weights read-back")[1]

    def close(self) -> None:
        process = self._process
        if process.is_alive() and not self._waiting:
            with contextlib.suppress(OSError):
                self._conn.send(("close",))
            process.join(CLOSE_WAIT_S)
        if process.is_alive():  # stopped mid-request, or not answering: stop it
            process.terminate()
            process.join(EXIT_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()
        if self._in_group:
            leave_group()
            self._in_group = False
        self._conn.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _send(self, request: tuple[Any, ...], doing: str) -> None:
        if not self._process.is_alive():
            raise self._failure(doing)
        try:
            self._conn.send(request)
        except OSError:
            raise self._failure(doing) from None
        self._waiting = True

    def _expect(self, doing: str) -> tuple[Any, ...]:
        """The rollout process's answer, or RolloutWorkerFailed as soon as it is gone."""
        while not self._conn.poll(POLL_S):
            if not self._process.is_alive():
                raise self._failure(doing)
        try:
            reply = self._conn.recv()
        except (EOFError, OSError):
            raise self._failure(doing) from None
        if reply[0] == "error":
            self._process.join(EXIT_WAIT_S)
            raise self._failure(doing, reply[1])
        self._waiting = False
        return reply

    def _collective(self, doing: str, call: Callable[[], None]) -> None:
        try:
            call()
        except RuntimeError as exc:  # torch.distributed's errors (peer gone, timeout)
            self._process.join(EXIT_WAIT_S)
            raise self._failure(doing, self._reported_error() or str(exc)) from None

    def _reported_error(self) -> str | None:
        with contextlib.suppress(EOFError, OSError):
            while self._conn.poll(0):
                reply = self._conn.recv()
                if reply[0] == "error":
                    return str(reply[1])
        return None

    def _failure(self, doing: str, reason: str | None = None) -> RolloutWorkerFailed:
        # A collective with a dead peer cannot be torn down cleanly (NCCL may block): the
        # process exits without leaving the group.
        self._in_group = False
        self._waiting = False
        process = self._process
        process.join(EXIT_WAIT_S if reason is None else 0)
        reason = reason or self._reported_error()
        if process.exitcode is None:
            state = "stopped answering"
        elif process.exitcode < 0:
            state = f"was killed by {signal.Signals(-process.exitcode).name}"
        else:
            state = f"exited with code {process.exitcode}"
        detail = f": {reason}" if reason else ""
        return RolloutWorkerFailed(
            f"rollout worker (pid {process.pid}) {state} during {doing}{detail}"
        )
