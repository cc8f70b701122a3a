"""Re-scoring on identical tokens (the reference engine's --score-tokens), on this machine:

1. self-consistency: the rollout path re-scores the tokens it sampled; how far are those
   logprobs from the ones it sampled them with (0 when scoring replays the sampler's kernels);
2. dtype gap: other rollout dtypes score the very same tokens; mean, p99 and max |d| and the
   signed mean against the sampled logprobs, plus the trainer side (identical when only the
   rollout side changes).

    python benchmarks/rescore_consistency.py [--work DIR] [--rollouts 2] [--dtypes float32]
        -- <engine flags, e.g. from `recipeval render RECIPE --stage logprob_diff`>
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def engine(flags: list[str], *extra: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "recipeval.reference", *flags, *extra],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def masked(path: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(path).to_pandas().sort_values(["rollout_id", "sample", "position"])
    keep = table["loss_mask"].to_numpy() == 1
    return {
        c: table[c].to_numpy()[keep]
        for c in ("rollout_id", "token_id", "logp_rollout", "logp_train")
    }


def describe(label: str, sampled: dict[str, np.ndarray], scored: dict[str, np.ndarray]) -> None:
    """Per rollout: at rollout 0 both runs hold the same weights; later ones follow the
    trainer, which on a GPU need not repeat itself bit for bit."""
    if not np.array_equal(sampled["token_id"], scored["token_id"]):
        raise SystemExit(f"{label}: the re-scored dump holds other tokens than the sampled one")
    for rollout in np.unique(sampled["rollout_id"]):
        at = sampled["rollout_id"] == rollout
        d = scored["logp_rollout"][at].astype(float) - sampled["logp_rollout"][at].astype(float)
        train = np.abs(
            scored["logp_train"][at].astype(float) - sampled["logp_train"][at].astype(float)
        )
        print(
            f"{label:>18} rollout {rollout}: {at.sum()} tokens; |d| mean {np.abs(d).mean():.3g}, p99 "
            f"{np.quantile(np.abs(d), 0.99):.3g}, max {np.abs(d).max():.3g}; signed mean "
            f"{d.mean():+.3g}; bitwise equal {np.mean(d == 0):.1%}; trainer side max |d| {train.max():.3g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="folder for the dumps (default: a temp dir)")
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument(
        "--dtypes", nargs="*", default=["float32"], help="other rollout dtypes to score with"
    )
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="engine flags after --")
    args = parser.parse_args()
    flags = [f for f in args.flags if f != "--"] + ["--num-rollout", str(args.rollouts)]
    work = args.work or Path(tempfile.mkdtemp(prefix="rescore-"))
    work.mkdir(parents=True, exist_ok=True)
    sampled_path = work / "sampled.parquet"
    print(f"sampling: {engine(flags, '--dump-logprobs', str(sampled_path)):.1f} s")
    sampled = masked(sampled_path)
    for dtype in [None, *args.dtypes]:
        label = "same rollout path" if dtype is None else f"rollout {dtype}"
        out = work / f"scored-{dtype or 'same'}.parquet"
        extra = ["--score-tokens", str(sampled_path), "--dump-logprobs", str(out)]
        if dtype:
            extra += ["--rollout-dtype", dtype]
        seconds = engine(flags, *extra)
        describe(label, sampled, masked(out))
        print(f"{'':>18}  ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
