"""False "regressed" nights and caught shifts of the nightly regression verdict, through the
same path `recipeval publish` takes (publish.compare.judge_run over run records: four judged
metrics a recipe, one max-statistic over them, change points, what changed).

    python benchmarks/regression_false_alarms.py [--trials 300] [--seed 0]
        [--family tuned|held-out|unseen|fresh|last|all] [--noise gauss] [--history 15 30]
        [--alpha 0.01]

Generators: benchmarks/nightly_generators.py (a tuned family, a held-out one and an unseen
one; the four metrics of a recipe drawn as a run produces them: train and rollout times, their
sum the cycle time, tokens/s its inverse; a fourth, fresh family of night-to-night correlated
noise and frequent slow nights; a fifth, last family of multimodal hosts and a Pareto tail).
Per noise model, rows:

- quiet, cv 2 %: 30 nights at a constant level; every second night from the 5th on is judged,
  and one is a false alarm when the recipe is "regressed" (target <= 1 % of quiet
  recipe-nights). The detector is scale-free (z statistics on a robust noise scale), so the
  noise level does not change this rate.
- +4 % at 0.5 % noise, +6 % at 2 % noise: 15 (or 30) quiet nights, then the train time
  (metric 0; the cycle time and tokens/s follow it by its share of the cycle) shifts and
  the torch package is bumped the same night; caught when the recipe is "regressed" on one of the first
  three shifted nights with metric 0 regressed; with the right night and cause when the change
  run is the night of the shift and "what changed" names torch, and with the cause in the span
  when "what changed" names torch and the reported span of nights holds the shift's night
  (target >= 95 %).
- +0.5 %/night drift at 1 % noise after 15 (or 30) quiet nights: caught within 10 nights.

    python benchmarks/regression_false_alarms.py --oracle [--trials 5000]

prints the bound instead: the +6 % / 2 % shift caught by a t test told the shift's night, at
the recipe's level, for 15-60 nights of history.
Each night a random one of three hosts runs the recipe, so "what changed" always has noise.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from nightly_generators import (
    FAMILIES,
    METRICS,
    Noise,
    Scenario,
    history,
)
from scipy import stats

from recipeval.analysis.regression import (
    RegressionSettingError,
    RegressionSettings,
    higher_is_better,
    max_statistic_levels,
    metric_correlation,
)
from recipeval.publish.compare import judge_run
from recipeval.publish.records import RunRecord, StageSummary

RECIPE = "bench-recipe"


def records(rng: np.random.Generator, values: np.ndarray, bump_at: int | None) -> list[RunRecord]:
    runs = []
    for night in range(values.shape[1]):
        metrics = {f"bench.metrics.{m}": float(v) for m, v in zip(METRICS, values[:, night])}
        torch = "2.9.2" if bump_at is not None and night >= bump_at else "2.9.1"
        runs.append(
            RunRecord(
                run_id=f"run{night:03d}",
                recipe=RECIPE,
                recipe_sha256="0" * 64,
                date=f"2026-11-{1 + night // 24:02d}T{night % 24:02d}:00:00+00:00",
                stages={"bench": StageSummary(status="pass")},
                metrics=metrics,
                intervals={m: (0.99 * v, 1.01 * v) for m, v in metrics.items()},
                packages={"torch": torch, "sglang": "0.5.16"},
                provenance={"host": f"node0{int(rng.integers(1, 4))}"},
            )
        )
    return runs


def false_alarm_rate(
    rng: np.random.Generator,
    noise: Noise,
    trials: int,
    settings: RegressionSettings,
    cv: float = 0.02,
) -> float:
    flagged = judged = 0
    for _ in range(trials):
        runs = records(rng, history(rng, Scenario(30, cv=cv), noise), None)
        for night in range(4, 30, 2):
            flagged += judge_run(runs[night], runs[: night + 1], settings).status == "regressed"
            judged += 1
    return flagged / judged


def catch_rate(
    rng: np.random.Generator,
    noise: Noise,
    scenario: Scenario,
    within: int,
    trials: int,
    settings: RegressionSettings,
) -> tuple[float, float, float]:
    """(caught within `within` nights, caught with the right night and cause, caught with the
    cause named and the shift's night inside the reported span, mean nights to the catch among
    those caught)."""
    caught = right = spanned = 0
    delays = []
    start = scenario.start or 0
    for _ in range(trials):
        runs = records(rng, history(rng, scenario, noise), start)
        for night in range(start, start + within):
            verdict = judge_run(runs[night], runs[: night + 1], settings)
            if verdict.status == "regressed" and any(
                m.metric.endswith(METRICS[0]) for m in verdict.regressions
            ):
                caught += 1
                delays.append(night - start + 1)
                named = any(c.key == "torch" for c in verdict.changes)
                right += named and verdict.change_run == runs[start].run_id
                first, last = verdict.change_span or ("", "")
                spanned += named and first <= runs[start].run_id <= last
                break
    delay = float(np.mean(delays)) if delays else float("nan")
    return caught / trials, right / trials, spanned / trials, delay


def oracle_catch_rate(
    rng: np.random.Generator, quiet_nights: int, trials: int, alpha: float
) -> tuple[float, float]:
    """The +6 % / 2 % shift told its night: on the third shifted night, a pooled two-sample
    t test (one-sided, towards worse) of each metric's three shifted nights against the quiet
    ones. Returns the share caught (a) by the train time alone at `alpha` and (b) by the
    recipe's step-down max-statistic over its four metrics at `alpha` (their correlation from
    the quiet nights, as judge_many does); Gaussian noise, the generator of the tuned family."""
    alone = recipe = 0
    signs = np.array([-1.0 if higher_is_better(m) else 1.0 for m in METRICS])
    for _ in range(trials):
        scenario = Scenario(quiet_nights + 3, cv=0.02, start=quiet_nights, shift=0.06)
        x = history(rng, scenario, FAMILIES["tuned"]["gauss"]) * signs[:, None]
        before, after = x[:, :quiet_nights], x[:, quiet_nights:]
        t, _ = stats.ttest_ind(after, before, axis=1)
        p = stats.t.sf(t, quiet_nights + 1)
        alone += bool(p[0] < alpha)
        corr = metric_correlation(list(before - np.median(before, axis=1, keepdims=True)))
        recipe += max_statistic_levels(list(p), corr, alpha)[0] > 0
    return alone / trials, recipe / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=(*FAMILIES, "all"), default="all")
    parser.add_argument(
        "--history",
        type=int,
        nargs="+",
        default=[15, 30],
        help="quiet nights before a shift or drift (default 15 30)",
    )
    parser.add_argument(
        "--noise",
        choices=sorted({name for models in FAMILIES.values() for name in models}),
        help="only this noise model; default all of the family",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=RegressionSettings.alpha,
        help="false alarms per recipe and night, as `recipeval publish --alpha` (publish.alpha "
        "in the config; default %(default)s)",
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="only the bound: the +6 %% / 2 %% shift caught when its night is known",
    )
    args = parser.parse_args()
    try:
        settings = RegressionSettings(alpha=args.alpha)
    except RegressionSettingError as err:
        parser.error(f"--alpha {err.value:g}: must be {err.expected}")
    if args.noise and args.family != "all" and args.noise not in FAMILIES[args.family]:
        parser.error(
            f"--noise {args.noise} is not in the {args.family} family "
            f"({', '.join(FAMILIES[args.family])}); drop --family or name its family"
        )
    rng = np.random.default_rng(args.seed)
    if args.oracle:
        for level, name in ((settings.alpha / 2, "alpha / 2"), (settings.alpha, "alpha")):
            for quiet_nights in (15, 30, 45, 60):
                alone, recipe = oracle_catch_rate(rng, quiet_nights, args.trials, level)
                print(
                    f"oracle at {name} ({level:g}) one-sided, night 3 of the shift after "
                    f"{quiet_nights} nights: train time alone {alone:6.1%}, max over the "
                    f"recipe's four metrics {recipe:6.1%}"
                )
        return
    print(f"settings: {settings}; {args.trials} recipes (4 metrics each) per row")
    started = time.perf_counter()
    for family, models in FAMILIES.items():
        if args.family not in (family, "all"):
            continue
        for name, noise in models.items():
            if args.noise not in (None, name):
                continue
            quiet = false_alarm_rate(rng, noise, args.trials, settings)
            print(f"{family:8} {name:9} false 'regressed' per quiet recipe-night: {quiet:.2%}")
            for quiet_nights in args.history:
                for label, scenario, within in (
                    (
                        "+4 % at 0.5 % noise",
                        Scenario(quiet_nights + 3, cv=0.005, start=quiet_nights, shift=0.04),
                        3,
                    ),
                    (
                        "+6 % at 2 % noise  ",
                        Scenario(quiet_nights + 3, cv=0.02, start=quiet_nights, shift=0.06),
                        3,
                    ),
                    (
                        "+0.5 %/night, 1 %  ",
                        Scenario(quiet_nights + 10, cv=0.01, start=quiet_nights, drift=0.005),
                        10,
                    ),
                ):
                    caught, right, spanned, delay = catch_rate(
                        rng, noise, scenario, within, args.trials, settings
                    )
                    print(
                        f"{'':18} after {quiet_nights} nights, {label} caught within {within:2d} nights "
                        f"{caught:7.1%}  right night and cause {right:7.1%}  cause, night in span "
                        f"{spanned:7.1%}  mean nights to catch {delay:.1f}"
                    )
    print(f"elapsed {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
