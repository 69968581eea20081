"""The learning study's tables (markdown) and plots from its JSON Lines
(``learning_study.py``'s ``--out``).

Per run: the take-off step (the first whose sampled reward, averaged over 5 steps,
reaches 0.5; censored at the run's last step), the final greedy evaluation, the
policy's mean movement per step; with step times (``at_s``), the wall time to a
smoothed reward of 0.9. Per arm: the share that took off with its exact interval, the
Kaplan-Meier median take-off step, the mean evaluation. Between the two arms of each
pair: the log-rank test on take-off, and the smallest differences the design could
detect (a share, at the two arms' pooled share; a hazard ratio, at the take-offs seen).

Run it with this package installed (it reads the task from ``grpo_tiny.py``)::

    python examples/learning_report.py runs.jsonl --pairs trl-farm:trl-local \\
        --plots DIR        # the plots need matplotlib
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_tiny import task_prompts
from learning_stats import (
    TAKE_OFF_REWARD,
    TAKE_OFF_WINDOW,
    clopper_pearson,
    detectable_hazard_ratio,
    detectable_share_difference,
    km_median,
    logrank,
    mean_se,
    take_off,
    trailing_mean,
)

from queue_rollout.lab.order import kendall_tau

REWARD_GOAL = 0.9  # the time-to-reward threshold of the smoothed sampled reward


def time_to(run: dict[str, Any], threshold: float = REWARD_GOAL) -> float | None:
    """Seconds from the run's first submission to the step whose smoothed reward
    reaches *threshold*; None where none does (or the run has no step times)."""
    step = take_off(run["rewards"], threshold)
    return None if step is None or not run.get("at_s") else run["at_s"][step - 1]


def arm_rows(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm's figures over its runs."""
    horizon = max(r["steps"] for r in runs)
    times = [r["take_off"] for r in runs]
    took = sum(t is not None for t in times)
    low, high = clopper_pearson(took, len(runs))
    evals = [r["eval_after"] for r in runs]
    reached = [time_to(r) for r in runs]
    return {"runs": len(runs), "took_off": took, "share": took / len(runs),
            "interval": (low, high), "km_median": km_median(times, horizon),
            "eval_mean": statistics.fmean(evals),
            "eval_se": statistics.stdev(evals) / math.sqrt(len(evals)) if len(evals) > 1
            else math.nan,
            "kl_mean": statistics.fmean(statistics.fmean(r["kl"]) for r in runs),
            "reached": sum(t is not None for t in reached),
            "time_median": km_median(reached, math.inf) if any(r.get("at_s") for r in runs)
            else None,
            "wall_mean": statistics.fmean(r["wall_s"] for r in runs)}


def pair_rows(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Two arms compared on take-off."""
    horizon = max(r["steps"] for r in [*a, *b])
    ta, tb = [r["take_off"] for r in a], [r["take_off"] for r in b]
    chi2, p = logrank(ta, tb, horizon)
    pooled = (sum(t is not None for t in ta) + sum(t is not None for t in tb)) / (len(a) + len(b))
    events = sum(t is not None for t in [*ta, *tb])
    return {"chi2": chi2, "p": p,
            "detectable_share": detectable_share_difference(len(a), len(b), pooled),
            "detectable_hazard_ratio": detectable_hazard_ratio(events)}


def order_rows(run: dict[str, Any], group_size: int = 16) -> dict[str, Any] | None:
    """Which prompts one run's trainer got, in what order, beside what was submitted:
    per group consumed and submitted its mean output length per member (the task's
    assigned lengths, which the episodes produce exactly), per consumed group its reward
    and its delay from submission to delivery; how many came from the first that many
    submitted, the rank correlation of submission and consumption order, and that of a
    consumed group's length and its delay."""
    if not run.get("submitted") or not run.get("got_s"):
        return None
    prompts = task_prompts(run["submitted"], run["seed"] + 1, f"train-s{run['seed']}",
                           group_size)
    length = {p["id"]: statistics.fmean(p["lengths"]) for p in prompts}
    index = {p["id"]: i for i, p in enumerate(prompts)}
    consumed = [(g, k) for k, ids in enumerate(run["groups"]) for g in ids]
    first = set(list(index)[:len(consumed)])
    return {"submitted": run["submitted"], "consumed": len(consumed),
            "from_first": sum(g in first for g, _ in consumed),
            "length_consumed": [length[g] for g, _ in consumed],
            "length_submitted": list(length.values()),
            "reward": [r for rs in run["group_rewards"] for r in rs],
            "delay": [run["got_s"][k] for _, k in consumed],
            "tau": kendall_tau([index[g] for g, _ in consumed], list(range(len(consumed)))),
            "length_delay_tau": kendall_tau([length[g] for g, _ in consumed],
                                            [run["got_s"][k] for _, k in consumed])}


def interval(values: Sequence[float]) -> str:
    """``mean (low-high)``: the mean and its normal 95% interval."""
    mean, se = mean_se(values)
    return f"{mean:.2f} ({mean - 1.96 * se:.2f}-{mean + 1.96 * se:.2f})"


def order_report(runs: Sequence[dict[str, Any]]) -> str:
    """Per arm, its runs' :func:`order_rows` pooled: the groups' mean output length
    per member consumed against submitted and the consumed groups' reward (each a
    mean over the groups with its normal 95% interval), the delay from submission
    to delivery (median and 90th percentile), how many came from the first that many
    submitted and the rank correlations (means over the runs)."""
    lines = ["| arm | runs | consumed of submitted | output tokens per member, consumed "
             "groups (95%) | the same, submitted groups | consumed groups' reward (95%) "
             "| delay to delivery, median / 90th percentile (s) | consumed from the first "
             "that many submitted | rank correlation, submission and consumption order | "
             "rank correlation, a group's length and its delay |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        row = order_rows(r)
        if row is not None:
            arms.setdefault(r["arm"], []).append(row)
    for arm, rows in sorted(arms.items()):
        def pooled(key: str, rows: list[dict[str, Any]] = rows) -> list[Any]:
            return [v for x in rows for v in x[key]]

        def mean(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return statistics.fmean(x[key] for x in rows)
        delays = sorted(pooled("delay"))
        lines.append(
            f"| {arm} | {len(rows)} | {mean('consumed'):.0f} of {mean('submitted'):.0f} | "
            f"{interval(pooled('length_consumed'))} | {interval(pooled('length_submitted'))} | "
            f"{interval(pooled('reward'))} | {statistics.median(delays):.1f} / "
            f"{delays[int(0.9 * (len(delays) - 1))]:.1f} | {mean('from_first'):.1f} | "
            f"{mean('tau'):.3f} | {mean('length_delay_tau'):.3f} |")
    return "\n".join(lines) if arms else ""


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def report(runs: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> str:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: (r["arm"], r["seed"])):
        by_arm.setdefault(r["arm"], []).append(r)
    lines = ["| arm | seed | take-off step | greedy eval, after | mean KL per step | "
             "time to reward 0.9 (s) | wall (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for arm, rs in by_arm.items():
        lines += [f"| {arm} | {r['seed']} | {fmt(r['take_off'], 'd')} | "
                  f"{r['eval_after']:.3f} | {statistics.fmean(r['kl']):.2e} | "
                  f"{fmt(time_to(r), '.0f')} | {r['wall_s']:.0f} |" for r in rs]
    lines += ["", "| arm | runs | took off | share (95% exact) | Kaplan-Meier median take-off | "
              "greedy eval, mean (SE) | mean KL per step | reached 0.9 | median time to 0.9 (s) |",
              "|---|---:|---:|---|---:|---|---:|---:|---:|"]
    for arm, rs in by_arm.items():
        a = arm_rows(rs)
        lines.append(f"| {arm} | {a['runs']} | {a['took_off']} | {a['share']:.2f} "
                     f"({a['interval'][0]:.2f}-{a['interval'][1]:.2f}) | "
                     f"{'not reached' if a['km_median'] is None else a['km_median']} | "
                     f"{a['eval_mean']:.3f} ({fmt(a['eval_se'])}) | {a['kl_mean']:.2e} | "
                     f"{a['reached']} | {fmt(a['time_median'], '.0f')} |")
    shown = [(x, y) for x, y in pairs if x in by_arm and y in by_arm]
    if shown:
        lines += ["", "| arms | log-rank chi-squared | p | smallest share difference "
                  "detectable (80%, 5%) | smallest hazard ratio detectable |",
                  "|---|---:|---:|---:|---:|"]
        for x, y in shown:
            c = pair_rows(by_arm[x], by_arm[y])
            lines.append(f"| {x} against {y} | {c['chi2']:.2f} | {c['p']:.3f} | "
                         f"{c['detectable_share']:.2f} | {c['detectable_hazard_ratio']:.1f} |")
    return "\n".join(lines)


def plots(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """The sampled reward smoothed as take-off reads it (its trailing mean over
    ``TAKE_OFF_WINDOW`` steps) against step and, for the runs that recorded their step
    times, against wall time: one panel per arm, each seed a thin line, the arm's mean a
    thick one (against step), the take-off threshold dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for x_axis in ("step", "wall"):
        timed = [r for r in runs if x_axis == "step"
                 or len(r.get("at_s") or []) == len(r["rewards"])]
        arms = sorted({r["arm"] for r in timed})
        if not arms:
            continue
        fig, axes = plt.subplots(1, len(arms), figsize=(4 * len(arms), 3.2), sharey=True,
                                 squeeze=False)
        for ax, arm in zip(axes[0], arms, strict=True):
            rs = [r for r in timed if r["arm"] == arm]
            smooth = [trailing_mean(r["rewards"]) for r in rs]
            for r, ys in zip(rs, smooth, strict=True):
                xs = r["at_s"] if x_axis == "wall" else range(1, len(ys) + 1)
                ax.plot(list(xs), ys, lw=0.7, alpha=0.6)
            if x_axis == "step":
                n = min(len(ys) for ys in smooth)
                ax.plot(range(1, n + 1), [statistics.fmean(ys[i] for ys in smooth)
                                          for i in range(n)], lw=2.2, color="black")
            ax.axhline(TAKE_OFF_REWARD, ls="--", lw=0.8, color="grey")
            ax.set_title(f"{arm} ({len(rs)} seeds)")
            ax.set_xlabel("step" if x_axis == "step" else "seconds")
        axes[0][0].set_ylabel(f"sampled reward, mean of {TAKE_OFF_WINDOW} steps")
        fig.tight_layout()
        path = out / f"reward-{x_axis}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the study's JSON Lines")
    parser.add_argument("--pairs", default="trl-farm:trl-local,grpo-farm:grpo-local",
                        help="arms compared, a:b,c:d (default: the farm against in process)")
    parser.add_argument("--arms", help="only these arms, comma-separated")
    parser.add_argument("--plots", type=Path, help="write the plots here (needs matplotlib)")
    args = parser.parse_args(argv)
    runs = [json.loads(line) for line in args.runs.read_text().splitlines() if line.strip()]
    if args.arms:
        runs = [r for r in runs if r["arm"] in args.arms.split(",")]
    if not runs:
        parser.error(f"no runs in {args.runs}")
    pairs = [(a, b) for a, _, b in (p.partition(":") for p in args.pairs.split(",")) if b]
    print(report(runs, pairs))
    if order := order_report(runs):
        print("\n" + order)
    if args.plots:
        for path in plots(runs, args.plots):
            print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
