"""Per-token logprob dump (Parquet): one row per response position of every sample, written one
row group per rollout, so a run stopped part-way leaves a readable file of the rollouts done."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("rollout_id", pa.int32()),
    ("sample", pa.int32()),
    ("position", pa.int32()),
    ("token_id", pa.int32()),
    ("logp_rollout", pa.float32()),
    ("logp_train", pa.float32()),
    ("loss_mask", pa.int8()),
])


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
