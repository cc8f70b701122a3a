"""Train-vs-rollout log-probability statistics: from per-token dumps, or from logged scalars when
the engine makes no dump. Pure functions over pandas tables.

A token table has one row per response token: rollout_id, sample, position (0-based within the
response), token_id, logp_rollout (the rollout engine's logprob of the sampled token),
logp_train (the trainer's recompute), loss_mask (1 where the token counts). d is
logp_rollout - logp_train.

Definitions follow the anchors so their thresholds apply unchanged:
- miles `train/train_rollout_logprob_abs_diff`: the masked mean of |d| per sample, averaged
  over samples (`mean_abs_diff`); the flat token mean is `token_mean_abs_diff`.
- miles `train/train_rollout_kl`: KL(rollout || train) by the k3 estimator of its
  compute_approx_kl(rollout, train, "low_var_kl"), exp(-d) + d - 1 per token (d clamped to
  [-20, 20], the estimate to [-10, 10]), then per-sample mean averaged over samples (`k3_kl`).
- miles `--ci-test` at every rollout: |mean rollout/log_probs - mean rollout/rollout_log_probs|
  <= 0.03 (the same per-sample-mean reduction), judged at the worst rollout
  (`worst_rollout_abs_mean_diff`) and at rollout 0 (`first_rollout_abs_mean_diff`), where both
  sides hold the same weights, so a gap there is numerics alone.
- NeMo-RL `token_mult_prob_error`: the masked mean over tokens of exp(|d|); <= 1.05.
- verl's probability-space guidance: mean |p_rollout - p_train| about 0.005 is good, 0.01 the
  limit (`prob_abs_diff_mean`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

TOKEN_COLUMNS = (
    "rollout_id",
    "sample",
    "position",
    "token_id",
    "logp_rollout",
    "logp_train",
    "loss_mask",
)
SAMPLE_KEYS = ["rollout_id", "sample"]
TOKEN_KEYS = ["rollout_id", "sample", "position"]
K3_CLAMP = 10.0
LOG_RATIO_CLAMP = 20.0
# A token whose probability differs by more than NeMo-RL's 1.05 factor between the two paths.
DEFAULT_ABS_DIFF_CUTOFF = math.log(1.05)
# Response-position bucket edges: fine at the start, doubling towards an 8k (and longer) context.
DEFAULT_POSITION_EDGES = (0, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)

# Check id -> (limit, source). Each statistic must stay at or below its limit.
DEFAULT_THRESHOLDS: dict[str, tuple[float, str]] = {
    "first_rollout_abs_mean_diff": (0.03, "miles --ci-test's limit, at rollout 0"),
    "worst_rollout_abs_mean_diff": (0.03, "miles --ci-test, every rollout"),
    "token_mult_prob_error": (1.05, "NeMo-RL"),
    "prob_abs_diff_mean": (0.01, "verl probability-diff guidance"),
}

# Logged scalar keys (as the miles parser names the step-table columns).
SCALAR_ABS_DIFF = "train/train_rollout_logprob_abs_diff"
SCALAR_KL = "train/train_rollout_kl"
SCALAR_TRAIN_LOGP = "rollout/log_probs"
SCALAR_ROLLOUT_LOGP = "rollout/rollout_log_probs"


class TokenTableError(ValueError):
    """The token table lacks a column, or two tables do not hold the same tokens."""


def check_token_table(table: pd.DataFrame, columns: Sequence[str] = TOKEN_COLUMNS) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise TokenTableError(
            f"token table lacks column(s) {', '.join(missing)}; expected {', '.join(columns)}"
        )


@dataclass(frozen=True)
class DiffStats:
    """Statistics of d = logp_a - logp_b over the masked tokens."""

    tokens: int
    samples: int
    mean_abs_diff: float
    token_mean_abs_diff: float
    mean_diff: float
    p50_abs_diff: float
    p99_abs_diff: float
    max_abs_diff: float
    k3_kl: float
    token_mult_prob_error: float
    prob_abs_diff_mean: float
    frac_above_cutoff: float
    abs_diff_cutoff: float
    first_rollout_abs_mean_diff: float
    position_spearman: float

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def k3_per_token(d: np.ndarray) -> np.ndarray:
    """miles' train_rollout_kl per token for d = logp_rollout - logp_train (module docstring)."""
    x = -np.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return np.clip(np.exp(x) - 1 - x, -K3_CLAMP, K3_CLAMP)


def _per_sample_mean(values: np.ndarray, sample_ids: np.ndarray) -> float:
    """Mean over samples of each sample's mean (the reduction miles logs)."""
    if len(values) == 0:
        return math.nan
    return float(pd.Series(values).groupby(sample_ids).mean().mean())


def diff_stats(
    table: pd.DataFrame,
    a: str = "logp_rollout",
    b: str = "logp_train",
    abs_diff_cutoff: float = DEFAULT_ABS_DIFF_CUTOFF,
) -> DiffStats:
    """Statistics of d = table[a] - table[b] over rows with loss_mask set."""
    check_token_table(table, (*TOKEN_KEYS, a, b, "loss_mask"))
    masked = table[table["loss_mask"].astype(bool)]
    d = (masked[a] - masked[b]).to_numpy(dtype=float)
    abs_d = np.abs(d)
    sample_key = pd.factorize(pd.MultiIndex.from_frame(masked[SAMPLE_KEYS]))[0]
    n = len(d)
    k3 = k3_per_token(d)
    in_first = (masked["rollout_id"] == masked["rollout_id"].min()).to_numpy(bool)
    quantiles = np.quantile(abs_d, [0.5, 0.99]) if n else [math.nan, math.nan]
    spearman = math.nan
    if n > 2 and np.ptp(masked["position"].to_numpy()) > 0 and np.ptp(abs_d) > 0:
        spearman = float(stats.spearmanr(masked["position"].to_numpy(), abs_d).statistic)
    return DiffStats(
        tokens=n,
        samples=len(np.unique(sample_key)),
        mean_abs_diff=_per_sample_mean(abs_d, sample_key),
        token_mean_abs_diff=float(abs_d.mean()) if n else math.nan,
        mean_diff=_per_sample_mean(d, sample_key),
        p50_abs_diff=float(quantiles[0]),
        p99_abs_diff=float(quantiles[1]),
        max_abs_diff=float(abs_d.max()) if n else math.nan,
        k3_kl=_per_sample_mean(k3, sample_key),
        token_mult_prob_error=float(np.exp(abs_d).mean()) if n else math.nan,
        prob_abs_diff_mean=float(
            np.abs(np.exp(masked[a].to_numpy(float)) - np.exp(masked[b].to_numpy(float))).mean()
        )
        if n
        else math.nan,
        frac_above_cutoff=float((abs_d > abs_diff_cutoff).mean()) if n else math.nan,
        abs_diff_cutoff=abs_diff_cutoff,
        first_rollout_abs_mean_diff=abs(_per_sample_mean(d[in_first], sample_key[in_first])),
        position_spearman=spearman,
    )


def by_position(
    table: pd.DataFrame,
    a: str = "logp_rollout",
    b: str = "logp_train",
    edges: Sequence[int] = DEFAULT_POSITION_EDGES,
) -> pd.DataFrame:
    """|d| by response-position bucket: does the error grow along the context?

    Columns: start, end (positions start <= p < end), tokens, mean_abs_diff (flat),
    p99_abs_diff, max_abs_diff. Only buckets holding tokens are returned; positions beyond the
    last edge fall in a final open bucket.
    """
    check_token_table(table, ("position", a, b, "loss_mask"))
    masked = table[table["loss_mask"].astype(bool)]
    abs_d = (masked[a] - masked[b]).abs().to_numpy(float)
    pos = masked["position"].to_numpy()
    bounds = np.append(np.asarray(edges, dtype=float), np.inf)
    index = np.searchsorted(bounds, pos, side="right") - 1
    rows = []
    for i in np.unique(index):
        sel = abs_d[index == i]
        rows.append(
            {
                "start": int(bounds[i]),
                "end": float(bounds[i + 1]) if math.isinf(bounds[i + 1]) else int(bounds[i + 1]),
                "tokens": len(sel),
                "mean_abs_diff": float(sel.mean()),
                "p99_abs_diff": float(np.quantile(sel, 0.99)),
                "max_abs_diff": float(sel.max()),
            }
        )
    return pd.DataFrame(
        rows, columns=["start", "end", "tokens", "mean_abs_diff", "p99_abs_diff", "max_abs_diff"]
    )


def rescored_pairs(sampled: pd.DataFrame, rescored: pd.DataFrame) -> pd.DataFrame:
    """Variant A's sampled tokens beside variant B's logprobs for the very same tokens.

    `sampled` is A's token table; `rescored` holds B's rollout-path logprobs of A's tokens
    (same keys and token ids). Returns a token table whose logp_rollout is B's and logp_train
    is A's rollout logprob, so `diff_stats` on it measures B - A directly, free of sampling
    noise.
    """
    check_token_table(sampled, (*TOKEN_KEYS, "token_id", "logp_rollout", "loss_mask"))
    check_token_table(rescored, (*TOKEN_KEYS, "token_id", "logp_rollout"))
    merged = sampled[[*TOKEN_KEYS, "token_id", "logp_rollout", "loss_mask"]].merge(
        rescored[[*TOKEN_KEYS, "token_id", "logp_rollout"]],
        on=TOKEN_KEYS,
        how="left",
        suffixes=("_a", "_b"),
        validate="one_to_one",
    )
    lost = merged["token_id_b"].isna()
    if lost.any():
        raise TokenTableError(f"re-scored table lacks {int(lost.sum())} of the sampled tokens")
    changed = merged["token_id_a"] != merged["token_id_b"]
    if changed.any():
        first = merged.loc[changed, TOKEN_KEYS].iloc[0].to_dict()
        raise TokenTableError(
            f"re-scored table holds other tokens than the sampled one ({int(changed.sum())} "
            f"differ, first at {first}): it must score the identical tokens"
        )
    return pd.DataFrame(
        {
            **{k: merged[k] for k in TOKEN_KEYS},
            "token_id": merged["token_id_a"].astype(int),
            "logp_rollout": merged["logp_rollout_b"],
            "logp_train": merged["logp_rollout_a"],
            "loss_mask": merged["loss_mask"],
        }
    )


def shared_prefix_pairs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two variants' dumps of the same seeded run, compared on the tokens both sampled.

    At the first rollout both start from the same weights and prompts and draw from the same
    random stream, so each sample's responses agree up to the first token where the two
    rollout paths' probabilities tipped the draw apart. On that shared prefix both paths
    scored the very same tokens in the very same context: their logprob difference is the
    backend difference itself, with no sampling noise. Returns a token table with B's rollout
    logprob as logp_rollout and A's as logp_train (`diff_stats` then measures B - A), over the
    shared prefix of the first rollout, masked in both; empty when nothing is shared.
    """
    cols = [*TOKEN_KEYS, "token_id", "logp_rollout", "logp_train", "loss_mask"]
    check_token_table(a, cols)
    check_token_table(b, cols)
    first = min(a["rollout_id"].min(), b["rollout_id"].min())
    merged = (
        a.loc[a["rollout_id"] == first, cols]
        .merge(b.loc[b["rollout_id"] == first, cols], on=TOKEN_KEYS, suffixes=("_a", "_b"))
        .sort_values(TOKEN_KEYS)
    )
    same = merged["token_id_a"] == merged["token_id_b"]
    prefix = same.groupby([merged["rollout_id"], merged["sample"]]).cummin()
    keep = prefix & merged["loss_mask_a"].astype(bool) & merged["loss_mask_b"].astype(bool)
    shared = merged[keep]
    return pd.DataFrame(
        {
            **{k: shared[k].to_numpy() for k in TOKEN_KEYS},
            "token_id": shared["token_id_a"].to_numpy(),
            "logp_rollout": shared["logp_rollout_b"].to_numpy(),
            "logp_train": shared["logp_rollout_a"].to_numpy(),
            "loss_mask": np.ones(len(shared), dtype=np.int8),
            # How far the two trainers' recomputes differ on these tokens (0 when both variants
            # train the same way on the same weights, which makes the comparison exact).
            "train_gap": (shared["logp_train_b"] - shared["logp_train_a"]).abs().to_numpy(),
        }
    )


@dataclass(frozen=True)
class ScalarStats:
    """What the logged per-step scalars say when there is no token dump."""

    steps: int
    mean_abs_diff: float  # mean over steps of train_rollout_logprob_abs_diff
    max_abs_diff: float  # the worst step's
    k3_kl: float
    first_rollout_abs_mean_diff: float
    worst_rollout_abs_mean_diff: float

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def scalar_stats(steps: pd.DataFrame) -> ScalarStats:
    """From a step table (one row per rollout id, columns = logged keys). A key that was not
    logged gives NaN; the caller decides whether that is an error."""

    def col(key: str) -> pd.Series:
        if key not in steps.columns:
            return pd.Series(dtype=float)
        return pd.to_numeric(steps[key], errors="coerce").dropna()

    abs_diff, kl = col(SCALAR_ABS_DIFF), col(SCALAR_KL)
    first = worst = math.nan
    if SCALAR_TRAIN_LOGP in steps.columns and SCALAR_ROLLOUT_LOGP in steps.columns:
        both = (
            steps[[SCALAR_TRAIN_LOGP, SCALAR_ROLLOUT_LOGP]]
            .apply(pd.to_numeric, errors="coerce")
            .dropna()
        )
        if len(both):
            gaps = (both.iloc[:, 0] - both.iloc[:, 1]).abs()
            first, worst = float(gaps.iloc[0]), float(gaps.max())
    return ScalarStats(
        steps=len(steps),
        mean_abs_diff=float(abs_diff.mean()) if len(abs_diff) else math.nan,
        max_abs_diff=float(abs_diff.max()) if len(abs_diff) else math.nan,
        k3_kl=float(kl.mean()) if len(kl) else math.nan,
        first_rollout_abs_mean_diff=first,
        worst_rollout_abs_mean_diff=worst,
    )


@dataclass(frozen=True)
class Verdict:
    check: str
    value: float
    limit: float
    ok: bool
    source: str


def thresholds_with(overrides: Mapping[str, float]) -> dict[str, tuple[float, str]]:
    """Defaults with a recipe's overrides on top; an override may add a limit on any other
    statistic (e.g. mean_abs_diff: 0.08 for the ROCm DeepSeek-V4 recipes)."""
    merged = dict(DEFAULT_THRESHOLDS)
    for key, limit in overrides.items():
        merged[key] = (float(limit), "recipe")
    return merged


def judge(
    values: Mapping[str, float], thresholds: Mapping[str, tuple[float, str]]
) -> list[Verdict]:
    """One verdict per threshold whose statistic is present; a NaN value fails (unmeasured)."""
    verdicts = []
    for check, (limit, source) in thresholds.items():
        if check not in values:
            continue
        value = float(values[check])
        verdicts.append(Verdict(check, value, limit, bool(value <= limit), source))
    return verdicts
