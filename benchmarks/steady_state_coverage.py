"""How good are the bench stage's steady-state statistics? Prints, on synthetic step-time traces
with a known truth:

1. warm-up detection: share of traces where the detected warm-up is within one step of the
   true one (target >= 95 %);
2. interval coverage: share of traces whose 95 % interval covers the true steady mean, at a
   fixed length and at the adaptive stop (nominal 95 %), beside bootstrap alternatives;
3. steps to a verdict: adaptive stopping against the anchors' fixed schedules (Megatron: median
   over steps 5-20; NeMo-RL: mean of the last 5 of 10) at the same precision (target >= 30 %
   fewer steps); min_steps and rel_ci are chosen on a second set of traces, not the scored one.
4. the shapes of issue 23 (benchmarks/step_time_generators.py: correlated steps, drift,
   gradual warm-ups, a recurring slow step, heavy tails; a tuned and a held-out family): share
   of traces whose interval covers the truth or that are reported not steady (target >= 92 %),
   at 20 steps and at the adaptive stop, with the steps taken and warm-up accuracy.
5. (--part drift-bound only) the best a trend test can do on the drift shape, at each level
   of stationary runs called "not steady".

Trace model (one draw per trace): steady mean mu ~ U(20, 500) s; relative noise sigma ~
U(2 %, 5 %), normal; warm-up length ~ U{0..5} steps, step i of it slower by
max(a * r**i, 25 %) with a ~ U(0.5, 3), r ~ U(0.3, 0.7) (a first step 1.5-4x slower, decaying);
after the warm-up each step is an outlier with probability 5 %, slower by U(15 %, 80 %).

    python benchmarks/steady_state_coverage.py [--traces 1000] [--seed 0] [--part all|shapes|drift-bound]
        [--max-steps 20] [--rel-ci 0.05] [--interval window|level]
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats
from step_time_generators import HELD_OUT, TUNED

from recipeval.analysis.steady_state import (
    IntervalKind,
    StoppingRule,
    detect_warmup,
    run_until_stop,
    steady_state,
)

TRACE_LEN = 80
ADAPTIVE_MAX_STEPS = 80


@dataclass(frozen=True)
class Trace:
    values: np.ndarray
    warmup: int
    mean: float


def make_trace(rng: np.random.Generator, n: int = TRACE_LEN) -> Trace:
    mu = rng.uniform(20, 500)
    sigma = rng.uniform(0.02, 0.05)
    warmup = int(rng.integers(0, 6))
    x = mu * (1 + sigma * rng.standard_normal(n))
    excess = np.maximum(rng.uniform(0.5, 3.0) * rng.uniform(0.3, 0.7) ** np.arange(warmup), 0.25)
    x[:warmup] *= 1 + excess
    outlier = (rng.random(n) < 0.05) & (np.arange(n) >= warmup)
    x[outlier] *= rng.uniform(1.15, 1.8, int(outlier.sum()))
    return Trace(x, warmup, mu)


def warmup_accuracy(traces: list[Trace], length: int) -> tuple[float, float]:
    hits = [abs(detect_warmup(t.values[:length]) - t.warmup) for t in traces]
    return float(np.mean(np.array(hits) <= 1)), float(np.mean(np.array(hits) == 0))


def fixed_length_coverage(
    traces: list[Trace], length: int, kind: IntervalKind
) -> tuple[float, float]:
    covered, widths = [], []
    for t in traces:
        iv = steady_state(t.values[:length], kind=kind).interval
        covered.append(iv.covers(t.mean))
        widths.append(iv.rel_width)
    return float(np.mean(covered)), float(np.median(widths))


def bootstrap_coverage(traces: list[Trace], length: int, statistic, method: str) -> float:
    rng = np.random.default_rng(1)
    covered = []
    for t in traces:
        x = t.values[:length]
        y = x[detect_warmup(x) :]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ci = stats.bootstrap(
                (y,), statistic, n_resamples=999, method=method, rng=rng, axis=-1
            ).confidence_interval
        covered.append(ci.low <= t.mean <= ci.high)
    return float(np.mean(covered))


def megatron_schedule(x: np.ndarray) -> float:
    return float(np.median(x[4:20]))  # steps 5..20, 1-based


def nemo_rl_schedule(x: np.ndarray) -> float:
    return float(np.mean(x[5:10]))  # last 5 of 10 steps


def adaptive(traces: list[Trace], rule: StoppingRule) -> dict[str, float]:
    steps, errors, covered, capped, odd = [], [], [], [], []
    for t in traces:
        decision = run_until_stop({"t": t.values}, rule)
        est = decision.estimates["t"].interval
        steps.append(decision.steps)
        errors.append(abs(est.estimate - t.mean) / t.mean)
        covered.append(est.covers(t.mean))
        capped.append(decision.reason == "max_steps")
        odd.append(len(decision.estimates["t"].odd))
    return {
        "mean_steps": float(np.mean(steps)),
        "median_steps": float(np.median(steps)),
        "p95_err": float(np.quantile(errors, 0.95)),
        "coverage": float(np.mean(covered)),
        "capped": float(np.mean(capped)),
        "odd": float(np.mean(odd)),
    }


def describe(res: dict[str, float], rule: StoppingRule, fixed_steps: int | None = None) -> str:
    saving = "" if fixed_steps is None else f", saving {1 - res['mean_steps'] / fixed_steps:.0%}"
    return (
        f"rel_ci {rule.rel_ci:.2%}: mean {res['mean_steps']:.1f} steps (median "
        f"{res['median_steps']:.0f}){saving}; 95 % of errors within +/-{res['p95_err']:.2%}; "
        f"coverage at stop {res['coverage']:.1%}; odd steps dropped {res['odd']:.2f} a "
        f"trace; hit max_steps {res['capped']:.1%}"
    )


def calibrate(traces: list[Trace], precision: float, min_steps: int, kind: IntervalKind) -> float:
    """The rel_ci (bisection, 6 rounds) at which adaptive runs keep 95 % of their errors
    within +/-precision on these traces; the realised error grows with rel_ci. The lower end
    (rel_ci = precision) is not itself tested: the pick checks it."""
    low, high = precision, min(8 * precision, 0.99)
    for _ in range(6):
        mid = (low + high) / 2
        if (
            adaptive(traces, StoppingRule(mid, min_steps, ADAPTIVE_MAX_STEPS, interval=kind))[
                "p95_err"
            ]
            > precision
        ):
            high = mid
        else:
            low = mid
    return low


def shapes(n_traces: int, seed: int, rule: StoppingRule) -> None:
    """Section 4: honest (covers the truth, or reported not steady) at 20 steps and at the stop."""
    print(
        f"4. issue-23 shapes, {n_traces} traces each; rule: rel_ci {rule.rel_ci:.0%}, min_steps "
        f"{rule.min_steps}, max_steps {rule.max_steps}, interval {rule.interval} (target: "
        "honest >= 92 %)"
    )
    print(
        f"   {'family':8} {'shape':15} {'honest@20':>9} {'not steady@20':>13} {'honest@stop':>11} "
        f"{'not steady@stop':>15} {'steps':>5} {'precise':>7} {'warm-up +/-1':>12}"
    )
    rng = np.random.default_rng(seed)
    for family, generators in (("tuned", TUNED), ("held-out", HELD_OUT)):
        for name, generate in generators.items():
            traces = [generate(rng) for _ in range(n_traces)]
            at20 = [steady_state(t.values[:20], kind=rule.interval) for t in traces]
            honest20 = np.mean(
                [
                    e.interval.covers(t.truth) or e.trending
                    for e, t in zip(at20, traces, strict=True)
                ]
            )
            stops = [run_until_stop({"t": t.values[: rule.max_steps]}, rule) for t in traces]
            at_stop = [d.estimates["t"] for d in stops]
            honest = np.mean(
                [
                    e.interval.covers(t.truth) or e.trending
                    for e, t in zip(at_stop, traces, strict=True)
                ]
            )
            warm = [abs(detect_warmup(t.values[:20]) - t.warmup) <= 1 for t in traces if t.warmup]
            print(
                f"   {family:8} {name:15} {honest20:9.1%} {np.mean([e.trending for e in at20]):13.1%} "
                f"{honest:11.1%} {np.mean([e.trending for e in at_stop]):15.1%} "
                f"{np.mean([d.steps for d in stops]):5.1f} "
                f"{np.mean([d.reason == 'precise' for d in stops]):7.1%} "
                + (f"{np.mean(warm):12.1%}" if warm else f"{'':>12}")
            )


def drift_bound(n_traces: int, seed: int) -> None:
    """Section 5: the best any detector can do on the tuned drift shape, told that the steps
    are independent Gaussian and that there is no warm-up or odd step: the mean's t interval
    plus the least-squares slope's t test (the most powerful unbiased test of a linear trend
    under that noise) at two-sided level a. Honest = the interval covers the start level or
    the slope is significant; a stationary run is called "not steady" in a of runs, exactly."""
    print(
        f"5. drift bound, {n_traces} traces: +0.1 %/step, noise U(1 %, 3 %), independent "
        "Gaussian steps; mean t interval + least-squares slope t test at level a"
    )
    rng = np.random.default_rng(seed)
    for steps in (20, 40):
        mu = rng.uniform(20, 500, (n_traces, 1))
        noise = rng.uniform(0.01, 0.03, (n_traces, 1))
        t = np.arange(steps)
        x = mu * (1 + 0.001 * t) * (1 + noise * rng.standard_normal((n_traces, steps)))
        half = stats.t.ppf(0.975, steps - 1) * x.std(axis=1, ddof=1) / np.sqrt(steps)
        covers = np.abs(x.mean(axis=1) - mu[:, 0]) <= half
        tc = t - t.mean()
        beta = (x - x.mean(axis=1, keepdims=True)) @ tc / (tc @ tc)
        resid = x - x.mean(axis=1, keepdims=True) - beta[:, None] * tc
        se = np.sqrt((resid**2).sum(axis=1) / (steps - 2) / (tc @ tc))
        p_trend = 2 * stats.t.sf(np.abs(beta / se), steps - 2)
        row = "   ".join(
            f"a {a:g}: {np.mean(covers | (p_trend < a)):6.1%}" for a in (0.01, 0.05, 0.1, 0.2, 0.3)
        )
        print(f"   {steps} steps, honest (stationary called not steady = a): {row}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--part", choices=("all", "shapes", "drift-bound"), default="all")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=StoppingRule().max_steps,
        help="max_steps of the rule in section 4",
    )
    parser.add_argument(
        "--rel-ci",
        type=float,
        default=StoppingRule().rel_ci,
        help="rel_ci of the rule in section 4",
    )
    parser.add_argument(
        "--interval",
        choices=("window", "level"),
        default=StoppingRule().interval,
        help="what the intervals cover (stages.bench.interval)",
    )
    args = parser.parse_args()
    kind = args.interval
    section4 = StoppingRule(rel_ci=args.rel_ci, max_steps=args.max_steps, interval=kind)
    if args.part == "drift-bound":
        drift_bound(args.traces, args.seed)
        return
    if args.part == "shapes":
        t0 = time.perf_counter()
        shapes(args.traces, args.seed, section4)
        print(f"\n({time.perf_counter() - t0:.0f} s)")
        return
    rng = np.random.default_rng(args.seed)
    traces = [make_trace(rng) for _ in range(args.traces)]
    t0 = time.perf_counter()
    print(
        f"{args.traces} synthetic traces (seed {args.seed}); trace model in this script's docstring\n"
    )

    print("1. warm-up detection (target: within one step in >= 95 % of traces)")
    for length in (10, 20, 40):
        within, exact = warmup_accuracy(traces, length)
        print(f"   first {length:2d} steps: within one step {within:6.1%}   exact {exact:6.1%}")

    print("\n2. coverage of the true steady mean by the 95 % interval (nominal 95 %)")
    for length in (10, 20, 40):
        cov, width = fixed_length_coverage(traces, length, kind)
        print(
            f"   odd steps out, 10% trimmed mean, Tukey-McLaughlin, first {length:2d} steps: "
            f"coverage {cov:6.1%}   median width {width:.2%} of the value"
        )
    trim = lambda y, axis=-1: stats.trim_mean(y, 0.1, axis=axis)
    for name, statistic, method in (
        ("bootstrap BCa, 10% trimmed mean", trim, "BCa"),
        ("bootstrap percentile, median", lambda y, axis=-1: np.median(y, axis=axis), "percentile"),
    ):
        print(
            f"   {name}, first 20 steps: coverage "
            f"{bootstrap_coverage(traces, 20, statistic, method):6.1%}   (not used; for comparison)"
        )

    print("\n3. steps to a verdict at the same precision (target: >= 30 % fewer steps)")
    print(
        "   (rel_ci per min_steps set on other traces; the min_steps of fewest steps there is the pick)"
    )
    calib_rng = np.random.default_rng(args.seed + 1)
    calibration = [make_trace(calib_rng) for _ in range(args.traces)]
    for name, schedule, fixed_steps in (
        ("Megatron, median of steps 5-20", megatron_schedule, 20),
        ("NeMo-RL, mean of the last 5 of 10", nemo_rl_schedule, 10),
    ):
        errors = [abs(schedule(t.values) - t.mean) / t.mean for t in traces]
        precision = float(np.quantile(errors, 0.95))
        print(f"   {name}: {fixed_steps} steps; 95 % of its errors within +/-{precision:.2%}")
        claimed = StoppingRule(2 * precision, 5, ADAPTIVE_MAX_STEPS, interval=kind)
        res = adaptive(traces, claimed)
        print(
            "      adaptive, min_steps 5, interval claims the same precision: "
            + describe(res, claimed, fixed_steps)
        )
        candidates = []
        for min_steps in (3, 4, 5, 6, 9):
            rule = StoppingRule(
                calibrate(calibration, precision, min_steps, kind),
                min_steps,
                ADAPTIVE_MAX_STEPS,
                interval=kind,
            )
            held_out = adaptive(calibration, rule)
            if held_out["p95_err"] <= precision:
                candidates.append((held_out["mean_steps"], rule))
        if not candidates:
            print("      no min_steps matched the precision on the held-out traces")
            continue
        pick = min(candidates, key=lambda c: c[0])[1]
        results = {rule.min_steps: adaptive(traces, rule) for _, rule in candidates}
        for _, rule in candidates:
            print(
                f"      adaptive, min_steps {rule.min_steps}, precision matched: "
                + describe(results[rule.min_steps], rule, fixed_steps)
                + ("  <- pick" if rule is pick else "")
            )
        res = results[pick.min_steps]
        print(
            f"      picked rule: {1 - res['mean_steps'] / fixed_steps:.0%} fewer steps (min_steps "
            f"{pick.min_steps}, rel_ci {pick.rel_ci:.2%}; 95 % of errors within "
            f"+/-{res['p95_err']:.2%} against the schedule's +/-{precision:.2%})"
        )
    default = replace(section4, min_steps=5, max_steps=ADAPTIVE_MAX_STEPS)
    print("   section 4's rule, min_steps 5: " + describe(adaptive(traces, default), default))
    print()
    shapes(args.traces, args.seed + 2, section4)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
