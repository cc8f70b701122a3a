"""Nightly metric histories with a known truth, for benchmarks/regression_false_alarms.py.

A recipe's four judged metrics are drawn the way a run produces them, not independently: each
night the train time and the rollout time are drawn, the cycle time is their sum and the
throughput is a fixed number of tokens per cycle over the cycle time. So the cycle time moves
with both parts and tokens/s mirrors the cycle time, as on a real cluster (before, the four
metrics were drawn independently, which no run produces).

Five families. The tuned family is what the detector's constants were chosen on; the held-out
family was written after them and never used to change them; the unseen family was written
before the max-statistic over metrics was measured and was never looked at while tuning it;
the fresh family was written last.

- tuned: Gaussian noise, or Student t with 3 degrees of freedom scaled to the same sd.
- held-out: Laplace noise (scaled to the sd); right-skewed noise (a lognormal whose log has sd
  0.8, centred and scaled to the sd: slow nights are far slower than fast nights are fast); and
  Gaussian noise with one night in 30 on a slow node (+4 to +8 noise sd on both parts).
- unseen: gamma noise (shape 4, skewness 1, scaled to the sd); and Gaussian noise with
  contention bursts: about one night in 20 starts a burst of 2-3 nights on which both parts are
  +1 to +2 noise sd slower (a shared file system or network under load for a few days).
- fresh (written in the round that added change-point pruning, before anything was measured
  on it; nothing was chosen on it: the one change also measured on it, an "all three newest
  nights moved" gate, was not adopted): Gaussian noise correlated from night to night (AR(1),
  phi 0.3: a slow week on a shared cluster); and Gaussian noise with about one night in 12
  slower by +2 to +4 noise sd on both parts (frequent, moderately slow nights).
- last (written at the start of the round after fresh, before anything was
  measured on it; nothing was chosen on it): three hosts of different speed (-1, 0, +1.5 noise
  sd), a random one each night, with Gaussian noise of half that sd on top (multimodal nights);
  and a Pareto (Lomax, shape 4.5) right tail, skewness about 5.5 (rare, very slow nights).

Levels: train and rollout each ~ U(20, 500) s; tokens per cycle ~ U(1e5, 1e6). A shift
multiplies the train time from its night on; a drift multiplies night j after its start by
1 + rate * j. The noise is `cv` relative on each part, so the train time (metric 0) carries
exactly the scenario's shift at the scenario's noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Unit-sd noise of the two drawn parts, shape (2, nights): row 0 train, row 1 rollout.
Noise = Callable[[np.random.Generator, int], np.ndarray]

METRICS = ("m0_train_s", "m1_rollout_s", "m2_cycle_s", "m3_tokens_per_sec")


def gauss(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((2, n))


def student_t3(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_t(3, (2, n)) / np.sqrt(3.0)


def laplace(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.laplace(0.0, 1 / np.sqrt(2.0), (2, n))


def skewed(rng: np.random.Generator, n: int) -> np.ndarray:
    s = 0.8
    mean, sd = np.exp(s * s / 2), np.sqrt((np.exp(s * s) - 1) * np.exp(s * s))
    return (rng.lognormal(0.0, s, (2, n)) - mean) / sd


def slow_node(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((2, n))
    hit = rng.random(n) < 1 / 30
    x[:, hit] += rng.uniform(4.0, 8.0, int(hit.sum()))
    return x


def gamma(rng: np.random.Generator, n: int) -> np.ndarray:
    shape = 4.0
    return (rng.gamma(shape, 1.0, (2, n)) - shape) / np.sqrt(shape)


def bursts(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((2, n))
    for start in np.flatnonzero(rng.random(n) < 1 / 20):
        x[:, start : start + int(rng.integers(2, 4))] += rng.uniform(1.0, 2.0)
    return x


def correlated(rng: np.random.Generator, n: int) -> np.ndarray:
    phi = 0.3
    x = np.empty((2, n))
    x[:, 0] = rng.standard_normal(2)
    for j in range(1, n):
        x[:, j] = phi * x[:, j - 1] + np.sqrt(1 - phi * phi) * rng.standard_normal(2)
    return x


def slow_nights(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((2, n))
    hit = rng.random(n) < 0.08
    x[:, hit] += rng.uniform(2.0, 4.0, int(hit.sum()))
    # Centred and scaled to unit sd: the slowdown has mean 0.08 * 3 and variance
    # 0.08 * 0.92 * 3^2 + 0.08 * 2^2 / 12 (a Bernoulli times a uniform on [2, 4]).
    return (x - 0.08 * 3.0) / np.sqrt(1 + 0.08 * 0.92 * 9 + 0.08 * 4 / 12)


def three_hosts(rng: np.random.Generator, n: int) -> np.ndarray:
    offsets = np.array([-1.0, 0.0, 1.5])
    x = offsets[rng.integers(0, 3, n)] + 0.5 * rng.standard_normal((2, n))
    # The offsets have mean 1/6 and variance 13/12 - 1/36; the noise adds 1/4.
    return (x - 1 / 6) / np.sqrt(13 / 12 - 1 / 36 + 0.25)


def pareto(rng: np.random.Generator, n: int) -> np.ndarray:
    shape = 4.5
    mean, var = 1 / (shape - 1), shape / ((shape - 1) ** 2 * (shape - 2))
    return (rng.pareto(shape, (2, n)) - mean) / np.sqrt(var)


TUNED: dict[str, Noise] = {"gauss": gauss, "t3": student_t3}
HELD_OUT: dict[str, Noise] = {"laplace": laplace, "skewed": skewed, "slow-node": slow_node}
UNSEEN: dict[str, Noise] = {"gamma": gamma, "bursts": bursts}
FRESH: dict[str, Noise] = {"correlated": correlated, "slow-nights": slow_nights}
LAST: dict[str, Noise] = {"three-hosts": three_hosts, "pareto": pareto}
FAMILIES: dict[str, dict[str, Noise]] = {
    "tuned": TUNED,
    "held-out": HELD_OUT,
    "unseen": UNSEEN,
    "fresh": FRESH,
    "last": LAST,
}


@dataclass(frozen=True)
class Scenario:
    """`nights` nights of the four METRICS; the train time changes from night `start` on."""

    nights: int
    cv: float = 0.02
    start: int | None = None
    shift: float = 0.0  # relative step at `start`
    drift: float = 0.0  # relative change per night from `start` on


def history(rng: np.random.Generator, scenario: Scenario, noise: Noise) -> np.ndarray:
    """(4, nights) array of nightly values, rows in the order of METRICS."""
    levels = rng.uniform(20, 500, 2)
    tokens = rng.uniform(1e5, 1e6)
    parts = levels[:, None] * (1 + scenario.cv * noise(rng, scenario.nights))
    if scenario.start is not None:
        after = np.arange(scenario.nights) >= scenario.start
        since = np.maximum(np.arange(scenario.nights) - scenario.start + 1, 0)
        parts[0] *= np.where(after, 1 + scenario.shift, 1.0) * (1 + scenario.drift * since)
    cycle = parts.sum(axis=0)
    return np.vstack([parts, cycle, tokens / cycle])
