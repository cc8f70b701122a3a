"""False-alarm and detection rates of analysis.regression over random histories.

    python benchmarks/regression_false_alarms.py [--trials 2000] [--seed 0]

For each noise model (Gaussian and heavy-tailed Student-t with 3 degrees of freedom, at several
night-to-night coefficients of variation) and history length, draw a history at a constant
level and judge one more draw from the same level (a false alarm if anything is flagged), and
one draw shifted by +6 % (detected if flagged as a regression), and three consecutive nights
at +6 % (detected if any of them is flagged: a shift that persists gets more than one chance).
Also histories with an old, already absorbed +8 % shift, judged on a draw at the new level
(false alarm if flagged).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from recipeval.analysis.regression import RegressionSettings, judge

METRIC = "bench.perf/step_time"


def draw(rng: np.random.Generator, n: int, cv: float, tails: str) -> np.ndarray:
    noise = rng.standard_normal(n) if tails == "gauss" else rng.standard_t(3, n) / np.sqrt(3.0)
    return 100.0 * (1 + cv * noise)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    settings = RegressionSettings()
    print(f"settings: {settings}; {args.trials} histories per row")
    print(
        f"{'noise':6} {'cv':>5} {'nights':>6} {'false alarm':>12} {'6% night 1':>11} "
        f"{'6% by night 3':>13} {'absorbed FA':>12}"
    )
    started = time.perf_counter()
    for tails in ("gauss", "t3"):
        for cv in (0.01, 0.02, 0.03, 0.05):
            for nights in (5, 15, 30):
                fa = det = det3 = absorbed = 0
                for _ in range(args.trials):
                    x = draw(rng, nights + 4, cv, tails)
                    history, same = list(x[:nights]), x[nights]
                    shifted = list(x[nights + 1 :] * 1.06)
                    fa += judge(METRIC, history, same, settings).kind != "unchanged"
                    flags = [
                        judge(METRIC, history + shifted[:i], shifted[i], settings).kind
                        == "regression"
                        for i in range(3)
                    ]
                    det += flags[0]
                    det3 += any(flags)
                    old = draw(rng, nights + 1, cv, tails)
                    old[nights // 2 :] *= 1.08
                    absorbed += (
                        judge(METRIC, old[:nights], old[nights], settings).kind != "unchanged"
                    )
                n = args.trials
                print(
                    f"{tails:6} {cv:5.2f} {nights:6d} {fa / n:12.2%} {det / n:11.2%} {det3 / n:13.2%} "
                    f"{absorbed / n:12.2%}"
                )
    print(f"elapsed {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
