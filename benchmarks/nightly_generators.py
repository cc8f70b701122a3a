"""Nightly metric histories with a known truth, for benchmarks/regression_false_alarms.py.

Two families. The tuned family is what the detector's constants were chosen on; the held-out
family was written after them and never used to change them, so its figures are the honest
ones.

- tuned: Gaussian noise, or Student t with 3 degrees of freedom scaled to the same sd.
- held-out: Laplace noise (scaled to the sd); right-skewed noise (a lognormal whose log has sd
  0.8, centred and scaled to the sd: slow nights are far slower than fast nights are fast); and
  Gaussian noise with one night in 30 on a slow node (+4 to +8 noise sd on that metric).

Levels: every metric of a recipe has its own level ~ U(20, 500); a shift multiplies the level
from its night on; a drift multiplies night j after its start by 1 + rate * j.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Noise = Callable[[np.random.Generator, int], np.ndarray]  # unit-sd noise, n draws


def gauss(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n)


def student_t3(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_t(3, n) / np.sqrt(3.0)


def laplace(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.laplace(0.0, 1 / np.sqrt(2.0), n)


def skewed(rng: np.random.Generator, n: int) -> np.ndarray:
    s = 0.8
    mean, sd = np.exp(s * s / 2), np.sqrt((np.exp(s * s) - 1) * np.exp(s * s))
    return (rng.lognormal(0.0, s, n) - mean) / sd


def slow_node(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal(n)
    hit = rng.random(n) < 1 / 30
    x[hit] += rng.uniform(4.0, 8.0, int(hit.sum()))
    return x


TUNED: dict[str, Noise] = {"gauss": gauss, "t3": student_t3}
HELD_OUT: dict[str, Noise] = {"laplace": laplace, "skewed": skewed, "slow-node": slow_node}


@dataclass(frozen=True)
class Scenario:
    """`nights` values of `metrics` metrics; metric 0 changes from night `start` on."""

    nights: int
    metrics: int = 4
    cv: float = 0.02
    start: int | None = None
    shift: float = 0.0  # relative step at `start`
    drift: float = 0.0  # relative change per night from `start` on


def history(rng: np.random.Generator, scenario: Scenario, noise: Noise) -> np.ndarray:
    """(metrics, nights) array of nightly values."""
    levels = rng.uniform(20, 500, scenario.metrics)
    x = levels[:, None] * (
        1
        + scenario.cv
        * noise(rng, scenario.metrics * scenario.nights).reshape(scenario.metrics, scenario.nights)
    )
    if scenario.start is not None:
        after = np.arange(scenario.nights) >= scenario.start
        since = np.maximum(np.arange(scenario.nights) - scenario.start + 1, 0)
        x[0] *= np.where(after, 1 + scenario.shift, 1.0) * (1 + scenario.drift * since)
    return x
