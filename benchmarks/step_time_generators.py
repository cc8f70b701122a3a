"""Step-time traces of the shapes real clusters produce, for benchmarks/steady_state_coverage.py
(section 4). Each trace has a known truth: the level its interval should cover.

Two families. The tuned family is what the steady-state rule's constants were chosen on; the
held-out family was written after them and never used to change them.

tuned (level mu ~ U(20, 500) s, relative noise ~ U(1 %, 3 %), normal unless said):
- ar1: AR(1) noise, phi 0.5 (a slow node or a shared file system stays slow for a few steps);
- drift: +2 % over 20 steps (+0.1 %/step), from the first step; truth: the start level;
- exp-warmup: 2-5 warm-up steps, step i slower by a * r**i (a ~ U(0.3, 1), r ~ U(0.4, 0.7));
- linear-warmup: 2-5 warm-up steps on a straight ramp from +U(10, 40) % down to the level;
- every-5th: every 5th step slower by U(20 %, 50 %); truth: the long-run mean;
- t3: Student t noise with 3 degrees of freedom scaled to the noise sd.

held-out (noise ~ U(0.5 %, 4 %)):
- ar1-laplace: AR(1), phi ~ U(0.3, 0.7), Laplace innovations;
- drift-skewed: +3 % over 30 steps, right-skewed (lognormal) noise; truth: the start level;
- sigmoid-warmup: a logistic fall from +U(20, 80) % centred on step U(1, 4), 1-2 steps wide;
  truth: the level, warm-up = the steps still more than 1 % slow;
- every-kth: every k-th step (k ~ U{3..7}, random phase) slower by U(10 %, 60 %), with 5 %
  of steps a random outlier +U(15 %, 80 %) as well; truth: the long-run mean without outliers;
- skewed: lognormal noise, one step in 20 a +U(15, 80) % outlier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

N_STEPS = 60


@dataclass(frozen=True)
class Trace:
    values: np.ndarray
    truth: float  # the level an honest interval covers
    warmup: int | None = None  # true warm-up length, where the family has one


Family = Callable[[np.random.Generator], Trace]


def _ar1(rng: np.random.Generator, n: int, phi: float, innovations: np.ndarray) -> np.ndarray:
    z = np.empty(n)
    z[0] = innovations[0] / np.sqrt(1 - phi * phi)
    for i in range(1, n):
        z[i] = phi * z[i - 1] + innovations[i]
    return z * np.sqrt(1 - phi * phi)  # unit marginal sd


def _skewed(rng: np.random.Generator, n: int) -> np.ndarray:
    s = 0.8
    mean, sd = np.exp(s * s / 2), np.sqrt((np.exp(s * s) - 1) * np.exp(s * s))
    return (rng.lognormal(0.0, s, n) - mean) / sd


def _level_noise(
    rng: np.random.Generator, low: float = 0.01, high: float = 0.03
) -> tuple[float, float]:
    return float(rng.uniform(20, 500)), float(rng.uniform(low, high))


def ar1(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng)
    return Trace(mu * (1 + s * _ar1(rng, N_STEPS, 0.5, rng.standard_normal(N_STEPS))), mu, 0)


def drift(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng)
    x = mu * (1 + 0.001 * np.arange(N_STEPS)) * (1 + s * rng.standard_normal(N_STEPS))
    return Trace(x, mu, 0)


def exp_warmup(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng)
    w = int(rng.integers(2, 6))
    x = mu * (1 + s * rng.standard_normal(N_STEPS))
    x[:w] *= 1 + rng.uniform(0.3, 1.0) * rng.uniform(0.4, 0.7) ** np.arange(w)
    return Trace(x, mu, w)


def linear_warmup(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng)
    w = int(rng.integers(2, 6))
    x = mu * (1 + s * rng.standard_normal(N_STEPS))
    x[:w] *= 1 + rng.uniform(0.1, 0.4) * (w - np.arange(w)) / w
    return Trace(x, mu, w)


def every_5th(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng)
    slow = rng.uniform(0.2, 0.5)
    x = mu * (1 + s * rng.standard_normal(N_STEPS))
    x[4::5] *= 1 + slow
    return Trace(x, mu * (1 + slow / 5), 0)


def t3(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng)
    return Trace(mu * (1 + s * rng.standard_t(3, N_STEPS) / np.sqrt(3.0)), mu, 0)


def ar1_laplace(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng, 0.005, 0.04)
    phi = rng.uniform(0.3, 0.7)
    z = _ar1(rng, N_STEPS, phi, rng.laplace(0.0, 1 / np.sqrt(2.0), N_STEPS))
    return Trace(mu * (1 + s * z), mu, 0)


def drift_skewed(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng, 0.005, 0.04)
    x = mu * (1 + 0.001 * np.arange(N_STEPS)) * (1 + s * _skewed(rng, N_STEPS))
    return Trace(x, mu, 0)


def sigmoid_warmup(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng, 0.005, 0.04)
    height, centre, width = rng.uniform(0.2, 0.8), rng.uniform(1, 4), rng.uniform(1, 2)
    excess = height / (1 + np.exp((np.arange(N_STEPS) - centre) / width * 4))
    x = mu * (1 + excess) * (1 + s * rng.standard_normal(N_STEPS))
    return Trace(x, mu, int(np.sum(excess > 0.01)))


def every_kth(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng, 0.005, 0.04)
    k, slow = int(rng.integers(3, 8)), rng.uniform(0.1, 0.6)
    x = mu * (1 + s * rng.standard_normal(N_STEPS))
    phase = int(rng.integers(1, k))  # the first step is never a slow one (warm-up cannot tell)
    x[phase::k] *= 1 + slow
    outlier = rng.random(N_STEPS) < 0.05
    x[outlier] *= rng.uniform(1.15, 1.8, int(outlier.sum()))
    return Trace(x, mu * (1 + slow / k), 0)


def skewed(rng: np.random.Generator) -> Trace:
    mu, s = _level_noise(rng, 0.005, 0.04)
    x = mu * (1 + s * _skewed(rng, N_STEPS))
    outlier = rng.random(N_STEPS) < 0.05
    x[outlier] *= rng.uniform(1.15, 1.8, int(outlier.sum()))
    return Trace(x, mu, 0)


TUNED: dict[str, Family] = {
    "ar1": ar1,
    "drift": drift,
    "exp-warmup": exp_warmup,
    "linear-warmup": linear_warmup,
    "every-5th": every_5th,
    "t3": t3,
}
HELD_OUT: dict[str, Family] = {
    "ar1-laplace": ar1_laplace,
    "drift-skewed": drift_skewed,
    "sigmoid-warmup": sigmoid_warmup,
    "every-kth": every_kth,
    "skewed": skewed,
}
