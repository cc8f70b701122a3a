"""Per-token logprob dump (Parquet): one row per response position of every sample, written one
row group per rollout, so a run stopped part-way leaves a readable file of the rollouts done.
`read_responses` reads one back for `--score-tokens`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("rollout_id", pa.int32()),
        ("sample", pa.int32()),
        ("position", pa.int32()),
        ("token_id", pa.int32()),
        ("logp_rollout", pa.float32()),
        ("logp_train", pa.float32()),
        ("loss_mask", pa.int8()),
    ]
)


@dataclass(frozen=True)
class Responses:
    """One rollout's sampled responses, (samples, positions) each."""

    token_ids: np.ndarray
    loss_mask: np.ndarray


class DumpError(ValueError):
    """A dump that cannot be scored; the message names the file and what is wrong."""


def read_responses(path: Path, samples: int) -> dict[int, Responses]:
    """rollout id -> its responses, from a dump of a run with `samples` samples per rollout."""
    try:
        table = pq.read_table(
            path, columns=["rollout_id", "sample", "position", "token_id", "loss_mask"]
        )
    except (OSError, pa.ArrowInvalid, KeyError) as err:
        raise DumpError(
            f"{path}: not a readable logprob dump ({str(err).splitlines()[0]})"
        ) from None
    frame = table.to_pandas().sort_values(["rollout_id", "sample", "position"])
    rollouts: dict[int, Responses] = {}
    for rollout_id, part in frame.groupby("rollout_id", sort=True):
        positions = int(part["position"].max()) + 1
        if part["sample"].nunique() != samples or len(part) != samples * positions:
            raise DumpError(
                f"{path}: rollout {rollout_id} holds {part['sample'].nunique()} samples of ragged "
                f"length or a count other than this run's {samples} (rollout-batch-size x "
                "n-samples-per-prompt must match the run that wrote it)"
            )
        shape = (samples, positions)
        rollouts[int(rollout_id)] = Responses(
            part["token_id"].to_numpy(np.int64).reshape(shape),
            part["loss_mask"].to_numpy(np.float32).reshape(shape),
        )
    return rollouts


class LogprobDump:
    """Writes to `<path>.partial` and renames to `path` on close: a reader never sees a file
    without its footer, and a run that is stopped still closes (and renames) what it has."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(self._partial, SCHEMA)

    def write(
        self,
        rollout_id: int,
        token_ids: np.ndarray,
        logp_rollout: np.ndarray,
        logp_train: np.ndarray,
        loss_mask: np.ndarray,
    ) -> None:
        """Arrays of shape (samples, positions)."""
        if self._writer is None:
            raise RuntimeError("dump already closed")
        samples, positions = token_ids.shape
        table = pa.table(
            {
                "rollout_id": np.full(samples * positions, rollout_id, dtype=np.int32),
                "sample": np.repeat(np.arange(samples, dtype=np.int32), positions),
                "position": np.tile(np.arange(positions, dtype=np.int32), samples),
                "token_id": token_ids.astype(np.int32).ravel(),
                "logp_rollout": logp_rollout.astype(np.float32).ravel(),
                "logp_train": logp_train.astype(np.float32).ravel(),
                "loss_mask": loss_mask.astype(np.int8).ravel(),
            },
            schema=SCHEMA,
        )
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        os.replace(self._partial, self.path)
