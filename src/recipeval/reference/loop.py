"""The driver: rollout -> train -> weight sync, per rollout id, in miles' order.

Colocated, without Ray the rollout worker and the trainer are two objects in this process, each
with its own weights; with Ray (inside a Ray job, or `--ray on`) they are two Ray actors and the
weights travel through the object store. Non-colocated (`--rollout-num-gpus` without
`--colocate`), the rollout worker is a process of its own on its own device and the weights are
broadcast through torch.distributed (noncolocated.py). Every way the weight sync copies the
trainer's weights into the rollout worker's own tensors; `--skip-weight-sync` (the planted
fault) leaves them stale.
With `--score-tokens DUMP` the rollout worker scores DUMP's responses instead of sampling, and
the trainer trains on them: another variant's tokens under this variant's rollout path.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Protocol

import torch

from recipeval.reference.config import ConfigError, EngineConfig
from recipeval.reference.dump import DumpError, LogprobDump, Responses, read_responses
from recipeval.reference.logfmt import MAIN, configure_logging
from recipeval.reference.modeling import resolve_device
from recipeval.reference.noncolocated import DistributedWorkers
from recipeval.reference.rollout import (
    RolloutBatch,
    RolloutWorker,
    check_rollout_device,
    limit_cpu_threads,
)
from recipeval.reference.trainer import Trainer, TrainResult
from recipeval.reference.warmstart import initial_state

logger = logging.getLogger(MAIN)
RAY_JOB_MARKER = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for the entrypoint
LOG_DRAIN_S = 2.0  # Ray's log monitor forwards within ~0.5 s on an idle machine


class Workers(Protocol):
    def generate(self, rollout_id: int, given: Responses | None = None) -> RolloutBatch: ...
    def train(self, batch: RolloutBatch) -> TrainResult: ...
    def sync_weights(self) -> None: ...
    def log_perf(self, rollout_id: int, update_weights_time: float) -> dict[str, float]: ...
    def close(self) -> None: ...


class LocalWorkers:
    def __init__(self, config: EngineConfig, state: dict[str, torch.Tensor]) -> None:
        self.rollout = RolloutWorker(config, state)
        self.trainer = Trainer(config, state)

    def generate(self, rollout_id: int, given: Responses | None = None) -> RolloutBatch:
        return self.rollout.generate(rollout_id, given)

    def train(self, batch: RolloutBatch) -> TrainResult:
        return self.trainer.train(batch)

    def sync_weights(self) -> None:
        self.rollout.load_weights(self.trainer.weights())

    def log_perf(self, rollout_id: int, update_weights_time: float) -> dict[str, float]:
        return self.trainer.log_perf(rollout_id, update_weights_time)

    def close(self) -> None:
        pass


def _flush_std_streams(actor: object) -> None:
    sys.stdout.flush()
    sys.stderr.flush()


class RayWorkers:
    """The same two objects as Ray actors; this driver owns them and kills them on close."""

    def __init__(self, config: EngineConfig, state: dict[str, torch.Tensor]) -> None:
        import ray

        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=True)
        gpus = (
            0.0 if resolve_device(config).type == "cpu" else (1.0 if config.num_gpus >= 2 else 0.5)
        )
        state_ref = ray.put(state)
        rollout_cls = ray.remote(num_cpus=1, num_gpus=gpus)(RolloutWorker)
        trainer_cls = ray.remote(num_cpus=1, num_gpus=gpus)(Trainer)
        self.rollout = rollout_cls.options(name=None).remote(config, state_ref)
        self.trainer = trainer_cls.remote(config, state_ref)
        ray.get([self.rollout.__ray_ready__.remote(), self.trainer.__ray_ready__.remote()])

    def generate(self, rollout_id: int, given: Responses | None = None) -> RolloutBatch:
        return self._ray.get(self.rollout.generate.remote(rollout_id, given))

    def train(self, batch: RolloutBatch) -> TrainResult:
        return self._ray.get(self.trainer.train.remote(batch))

    def sync_weights(self) -> None:
        self._ray.get(self.rollout.load_weights.remote(self.trainer.cpu_weights.remote()))

    def log_perf(self, rollout_id: int, update_weights_time: float) -> dict[str, float]:
        return self._ray.get(self.trainer.log_perf.remote(rollout_id, update_weights_time))

    def close(self) -> None:
        # Ray forwards actor output to the driver asynchronously and loses what is still in
        # flight when the driver exits (ray-project/ray#31931): the last rollout's log lines,
        # which the stages count. Flush the actors, then give the log monitor time to deliver.
        try:
            self._ray.get(
                [a.__ray_call__.remote(_flush_std_streams) for a in (self.rollout, self.trainer)],
                timeout=30,
            )
            time.sleep(LOG_DRAIN_S)
        except Exception as exc:  # noqa: BLE001 - a dead actor has nothing left to deliver
            logger.debug(f"flushing the actors' output: {exc!r}")
        for actor in (self.rollout, self.trainer):
            self._ray.kill(actor)
        if self._started:
            self._ray.shutdown()


def use_ray(config: EngineConfig) -> bool:
    return config.ray == "on" or (config.ray == "auto" and RAY_JOB_MARKER in os.environ)


def read_given(config: EngineConfig) -> dict[int, Responses] | None:
    """The responses `--score-tokens` names, one per rollout this run makes."""
    if config.score_tokens is None:
        return None
    if not config.score_tokens.is_file():
        raise ConfigError(f"--score-tokens {config.score_tokens}: no such file")
    try:
        given = read_responses(config.score_tokens, config.samples_per_rollout)
    except DumpError as err:
        raise ConfigError(f"--score-tokens {err}") from None
    missing = [i for i in range(config.num_rollout) if i not in given]
    if missing:
        raise ConfigError(
            f"--score-tokens {config.score_tokens} holds rollouts {sorted(given)}, not rollout "
            f"{missing[0]}; set --num-rollout to at most the rollouts it holds"
        )
    too_long = max(r.token_ids.shape[1] for r in given.values())
    if too_long > config.rollout_max_response_len:
        raise ConfigError(
            f"--score-tokens {config.score_tokens} holds {too_long}-token responses, more than "
            f"--rollout-max-response-len {config.rollout_max_response_len}"
        )
    return given


def run(config: EngineConfig) -> list[dict[str, Any]]:
    """Run num_rollout rollout/train/sync cycles; returns one summary dict per rollout id."""
    configure_logging()
    limit_cpu_threads(config)
    device = resolve_device(config)
    check_rollout_device(config, device)  # before the warm start, not after it
    placement = "non-colocated" if config.noncolocated else "colocated"
    ray = use_ray(config) and not config.noncolocated
    logger.info(
        f"reference engine: device {device}, {placement}, ray {ray}, config {config.to_dict()}"
    )
    given = read_given(config)
    state = initial_state(config, device)
    workers: Workers
    if config.noncolocated:
        workers = DistributedWorkers(config, state)
    elif ray:
        workers = RayWorkers(config, state)
    else:
        workers = LocalWorkers(config, state)
    dump = LogprobDump(config.dump_logprobs) if config.dump_logprobs else None
    history: list[dict[str, Any]] = []
    try:
        for rollout_id in range(config.num_rollout):
            batch = workers.generate(rollout_id, given[rollout_id] if given else None)
            result = workers.train(batch)
            if dump is not None:
                dump.write(
                    rollout_id,
                    batch.response_ids.numpy(),
                    batch.rollout_logprobs.numpy(),
                    result.train_logprobs.numpy(),
                    batch.response_mask.numpy(),
                )
            sync_start = time.perf_counter()
            if not config.skip_weight_sync:
                workers.sync_weights()
            perf = workers.log_perf(rollout_id, time.perf_counter() - sync_start)
            history.append(
                {
                    **result.rollout_metrics,
                    **result.step_metrics,
                    **perf,
                    "perf/rollout_time": batch.rollout_time,
                }
            )
    finally:
        if dump is not None:
            dump.close()
        workers.close()
    return history
