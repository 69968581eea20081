"""What ``queue-rollout bench`` prints and writes: tables, a markdown report, PNG plots.

Plots need matplotlib (``pip install 'queue-rollout[bench]'``); it is imported only
when ``--out`` asks for them.
"""

from __future__ import annotations

import math
import platform
from pathlib import Path
from typing import Any

from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.seed_pilots import SENSITIVE
from queue_rollout.lab.plots import pyplot

ROWS = (  # (label, key, format)
    ("mean rollout interval, b2-6 (s)", "mean_rollout_interval_s", ".2f"),
    ("all-work completion (s)", "all_work_completion_s", ".2f"),
    ("mean active episodes", "mean_active_episodes", ".2f"),
    ("slot occupancy", "slot_occupancy", ".3f"),
    ("ideal_ratio", "ideal_ratio", ".3f"),
    ("accepted groups per hour", "accepted_groups_per_hour", ".0f"),
    ("output tokens", "output_tokens", ".0f"),
)


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def _change(value: Any) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def pilot_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """(metric, group, sample, change, group ref, sample ref) rows of one pilot."""
    g, s = result["modes"]["group"], result["modes"]["sample"]
    rows = []
    for label, key, fmt in ROWS:
        ref = key in g["reference"]
        rows.append((label, _fmt(g[key], fmt), _fmt(s[key], fmt), _change(result["change"][key]),
                     _fmt(g["reference"][key], fmt) if ref else "",
                     _fmt(s["reference"][key], fmt) if ref else ""))
    return rows


#: The seed's figures and where the model's are: (label, seed key, model key, unit).
SEED_ROWS = (
    ("first batch ready (s)", "first_batch_s", "first_batch_s", "time"),
    ("last batch ready (s)", "batches_ready_s", "batches_ready_s", "time"),
    ("median batch interval (s)", "median_batch_interval_s", "median_batch_interval_s",
     "time"),
    ("mean rollout interval, b2-6 (s)", "mean_rollout_interval_s", "mean_rollout_interval_s",
     "time"),
    ("mean cycle, b2-6 (s)", "mean_cycle_s", "mean_cycle_s", "time"),
    ("steady groups per hour", "accepted_groups_per_hour", "steady_groups_per_hour", "rate"),
    ("mean active episodes", "mean_active_episodes", "mean_active_episodes", ""),
    ("GPU busy (NVML utilization)", "gpu_busy", "gpu_busy", ""),
    ("all candidates complete (s)", "complete_candidates_s", "all_work_completion_s", "time"),
)


def seed_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """(metric, ideal group, ideal sample, ideal change, stack change, seed group, seed
    sample, seed change) in the reference's units, for each figure the seed reports."""
    seed = result.get("seed")
    if not seed:
        return []
    t = result["scale"]["time"]
    factor = {"time": 1 / t, "rate": t, "": 1.0}
    rows: list[tuple[str, ...]] = []
    for label, seed_key, key, unit in SEED_ROWS:
        seed_g = seed.get("group", {}).get(seed_key)
        seed_s = seed.get("sample", {}).get(seed_key)
        seed_change = seed.get("change", {}).get(seed_key)
        if seed_change is None and seed_g and seed_s is not None:
            seed_change = seed_s / seed_g - 1
        if seed_g is None and seed_change is None:
            continue
        ideal = [result["modes"][m]["ideal"].get(key) for m in ("group", "sample")]
        ideal = [None if v is None else v * factor[unit] for v in ideal]
        measured = result["change"].get(key)
        rows.append((label, _fmt(ideal[0], ".4g"), _fmt(ideal[1], ".4g"),
                     _change(ideal[1] / ideal[0] - 1 if ideal[0] and ideal[1] is not None
                             else None),
                     _change(measured), _fmt(seed_g, ".4g"), _fmt(seed_s, ".4g"),
                     _change(seed_change)))
    return rows


SEED_HEADER = ("metric (reference units)", "ideal group", "ideal sample", "ideal change",
               "stack change", "seed group", "seed sample", "seed change")


def _interval(x: dict[str, float] | None) -> str:
    """A mean with its 95% interval (:func:`~queue_rollout.lab.order.mean_interval`)."""
    return "-" if x is None else f"{x['mean']:g} ({x['low']:g}-{x['high']:g})"


def pilot_text(result: dict[str, Any]) -> str:
    sc = result["scale"]
    lines = [f"bench {result['profile']}: measured at time x{sc['time']:g}, tokens "
             f"x{sc['tokens']:g}; 'ref' columns scaled back to the reference's units",
             f"  {'':<34}{'group':>11}{'sample':>11}{'change':>9}{'group ref':>12}"
             f"{'sample ref':>12}"]
    for label, g, s, ch, gr, sr in pilot_rows(result):
        lines.append(f"  {label:<34}{g:>11}{s:>11}{ch:>9}{gr:>12}{sr:>12}")
    ideal = [result["modes"][m]["ideal"] for m in ("group", "sample")]
    lines.append(f"  {'ideal all-work (s)':<34}{ideal[0]['all_work_completion_s']:>11.2f}"
                 f"{ideal[1]['all_work_completion_s']:>11.2f}")
    lines.append(f"  {'ideal slot occupancy':<34}{ideal[0]['slot_occupancy']:>11.3f}"
                 f"{ideal[1]['slot_occupancy']:>11.3f}")
    rows = seed_rows(result)
    if rows:
        lines.append("  beside the seed (reference units; the model's ideal schedule):")
        lines.append(f"  {SEED_HEADER[0]:<34}" + "".join(f"{h:>13}" for h in SEED_HEADER[1:]))
        lines += [f"  {row[0]:<34}" + "".join(f"{v:>13}" for v in row[1:]) for row in rows]
    for mode, o in (result.get("completion_order") or {}).items():
        lines.append(
            f"  completion order, {mode}: of the {o['groups_trained']} groups trained, "
            f"{o['trained_from_first_submitted']} from the first {o['groups_trained']} "
            f"submitted; tokens per member {_interval(o['length_trained'])} against "
            f"{_interval(o.get('length_not_trained'))} not trained, "
            f"{_interval(o['length_submitted'])} submitted; rank correlation of delivery "
            f"order with submission order {o['order_tau']:.3f}, with length "
            f"{o['length_order_tau']:.3f}")
    for row in result.get("sensitivity", []):
        lines.append(f"  sensitivity, {row['choice']}: sample vs group " + ", ".join(
            f"{k} {_change(v)}" for k, v in row["change"].items() if v is not None))
    calibration = result.get("calibration") or {}
    if "achieved" in calibration:
        lines.append("  calibration (group admission's ideal schedule vs the seed's "
                     f"baseline, worst {calibration['worst_error']:.1%}): " + ", ".join(
                         f"{k} {v:.4g} (target {calibration['targets'][k]:.4g})"
                         for k, v in calibration["achieved"].items()))
    return "\n".join(lines)


def pilot_markdown(result: dict[str, Any]) -> str:
    lines = ["| metric | group admission | sample refill | change | group (ref. s) | "
             "sample (ref. s) |", "|---|---:|---:|---:|---:|---:|"]
    for row in pilot_rows(result):
        lines.append("| " + " | ".join(row) + " |")
    for key, label in (("all_work_completion_s", "ideal all-work completion (s)"),
                       ("slot_occupancy", "ideal slot occupancy")):
        g, s = (result["modes"][m]["ideal"][key] for m in ("group", "sample"))
        lines.append(f"| {label} | {g:.3f} | {s:.3f} | | | |")
    rows = seed_rows(result)
    if rows:
        lines += ["", "Beside the seed (reference units):", "",
                  "| " + " | ".join(SEED_HEADER) + " |", "|---" + "|---:" * 7 + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    if result.get("sensitivity"):
        lines += ["", "Sensitivity (ideal schedules, one choice changed at a time; sample "
                  "refill's change against group admission):", "",
                  "| choice | first batch | steady groups/h | active episodes | "
                  "rollout interval | all-work |", "|---|---:|---:|---:|---:|---:|"]
        for row in result["sensitivity"]:
            ch = row["change"]
            lines.append(f"| {row['choice']} | " + " | ".join(_change(ch[k])
                                                             for k in SENSITIVE) + " |")
    calibration = result.get("calibration") or {}
    if "achieved" in calibration:
        lines += ["", "Calibration: fitted " + ", ".join(
            f"`{k}` = {v:.4g}" for k, v in calibration["fitted"].items()) + "; group "
            "admission's ideal schedule against the seed's baseline: " + ", ".join(
            f"{k} {v:.4g} (target {calibration['targets'][k]:.4g})"
            for k, v in calibration["achieved"].items())
            + f"; worst {calibration['worst_error']:.1%}."]
    return "\n".join(lines)


PLACEMENT_ROWS = (  # (label, key, format)
    ("prefill computed per group (tokens)", "prefill_tokens_computed_per_group", ".0f"),
    ("  in prompts' worth", "prompt_computations_per_group", ".2f"),
    ("prefill cached per group (tokens)", "prefill_tokens_cached_per_group", ".0f"),
    ("cache hit rate", "cache_hit_rate", ".3f"),
    ("mean rollout interval, b2-6 (s)", "mean_rollout_interval_s", ".2f"),
    ("all-work completion (s)", "all_work_completion_s", ".2f"),
    ("ideal_ratio", "ideal_ratio", ".3f"),
)


KV_ROWS = (  # (label, key, format)
    ("retractions", "retractions", ".0f"),
    ("recomputed prefill (tokens)", "recomputed_prefill_tokens", ".0f"),
    ("all-work completion (s)", "all_work_completion_s", ".2f"),
    ("output tokens per second", "tokens_per_s", ".0f"),
    ("mean rollout interval, b2-6 (s)", "mean_rollout_interval_s", ".2f"),
    ("mean running requests", "mean_running_requests", ".1f"),
    ("ideal_ratio", "ideal_ratio", ".3f"),
    ("Redis commands per episode", "redis_commands_per_episode", ".1f"),
)


def run_rows(result: dict[str, Any], spec: tuple[tuple[str, str, str], ...]
             ) -> list[list[str]]:
    """Profiles of several runs (long-prompt, kv-pressure): (metric, then measured and
    ideal per run) rows, one per *spec* entry."""
    rows = []
    for label, key, fmt in spec:
        row = [label]
        for run in result["runs"].values():
            # the real stack's own figures have no ideal counterpart
            row += [_fmt(run.get(key), fmt), _fmt(run["ideal"].get(key), fmt)
                    if key in run["ideal"] else ""]
        rows.append(row)
    return rows


def placement_rows(result: dict[str, Any]) -> list[list[str]]:
    """long-prompt: (metric, then measured and ideal per run) rows."""
    rows = run_rows(result, PLACEMENT_ROWS)
    split = ["groups split over replicas"]
    for run in result["runs"].values():
        split += [str(run["placements"]["split"]), str(run["ideal"]["placements"].get("split", 0))]
    rows.append(split)
    return rows


def kv_rows(result: dict[str, Any]) -> list[list[str]]:
    """kv-pressure: (metric, then measured and ideal per run) rows; the workers' mean
    limit in the ideal schedule."""
    rows = run_rows(result, KV_ROWS)
    limit = ["mean slots the workers take (ideal)"]
    for run in result["runs"].values():
        limit += ["", _fmt(run["ideal"]["mean_slots_limit"], ".1f")]
    rows.append(limit)
    return rows


def kv_text(result: dict[str, Any]) -> str:
    sc, shape = result["scale"], result["shape"]
    lines = [f"bench {result['profile']}: a KV pool of {shape['max_total_tokens']} tokens per "
             f"replica, {shape['slots'] // shape['replicas']} slots fixed or adaptive (floor "
             f"{shape['min_slots_per_replica']}), max_staleness {shape['max_staleness']}; time "
             f"x{sc['time']:g}, tokens x{sc['tokens']:g}"]
    lines += _table_text(_runs_header(result), kv_rows(result))
    for mode in ("group", "sample"):
        ch = result["ideal_change"][mode]
        lines.append(f"  {mode} admission, adaptive against fixed slots (ideal): retractions "
                     f"{_change(ch['retractions'])}, all-work "
                     f"{_change(ch['all_work_completion_s'])}, tokens/s "
                     f"{_change(ch['tokens_per_s'])}")
    for mode, u in result["unlimited_pool"].items():
        fixed = result["runs"][f"{mode}/fixed"]["ideal"]["all_work_completion_s"]
        lines.append(f"  {mode} admission with a pool no run fills (ideal, fixed slots): "
                     f"all-work {u['all_work_completion_s']:.2f} s against {fixed:.2f} s "
                     f"({_change(u['all_work_completion_s'] / fixed - 1)}): the most any "
                     "controller could save")
    for name, c in result["controls"].items():
        lines.append(f"  control {name} (shipped pool, ideal): all-work {c['fixed_all_work_s']:.2f}"
                     f" s fixed, {c['adaptive_all_work_s']:.2f} s adaptive "
                     f"({_change(c['change'])})")
    return "\n".join(lines)


def kv_markdown(result: dict[str, Any]) -> str:
    return _table_markdown(_runs_header(result), kv_rows(result))


def _table_text(header: list[str], rows: list[list[str]]) -> list[str]:
    width = max(21, *(len(h) + 2 for h in header[1:]))
    return [f"  {row[0]:<38}" + "".join(f"{v:>{width}}" for v in row[1:])
            for row in [header, *rows]]


def _table_markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _runs_header(result: dict[str, Any]) -> list[str]:
    return ["metric"] + [f"{name} {kind}" for name in result["runs"]
                         for kind in ("measured", "ideal")]


def placement_text(result: dict[str, Any]) -> str:
    sc, shape = result["scale"], result["shape"]
    lines = [f"bench {result['profile']}: {shape['prompt_tokens']}-token prompts, prefill "
             f"rounds of {shape['chunked_prefill_size']} tokens; time x{sc['time']:g}, "
             f"tokens x{sc['tokens']:g}"]
    lines += _table_text(_runs_header(result), placement_rows(result))
    for mode in ("group", "sample"):
        ch = result["ideal_change"][mode]
        lines.append(f"  {mode} admission, placement group against any (ideal): prefill "
                     f"computed {_change(ch['prefill_tokens_computed_per_group'])}, rollout "
                     f"interval {_change(ch['mean_rollout_interval_s'])}, all-work "
                     f"{_change(ch['all_work_completion_s'])}")
    return "\n".join(lines)


def placement_markdown(result: dict[str, Any]) -> str:
    return _table_markdown(_runs_header(result), placement_rows(result))


def write_report(out: Path, results: list[dict[str, Any]],
                 runs: dict[str, dict[str, ModeRun]], sweeps: dict[str, list[dict[str, Any]]],
                 command: str) -> Path:
    """``report.md`` and the PNG plots under *out*; returns the report's path."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    md = ["# queue-rollout bench report", "",
          f"Command: `{command}`", "",
          f"Machine: {platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}", ""]
    for result in results:
        name = result["profile"]
        if name == "kv-pressure":  # a run per (mode, slots)
            md += [f"## {name}", "", kv_markdown(result), ""]
        elif "runs" in result:  # long-prompt: a run per (mode, placement)
            md += [f"## {name}", "", placement_markdown(result), ""]
        elif name in runs:
            md += [f"## {name}", "", pilot_markdown(result), ""]
            for kind in _plot_pilot(plt, out, name, runs[name], result):
                md += [f"![{name} {kind}]({name}-{kind}.png)", ""]
            if name in sweeps:
                md += [f"### {name}: the staleness window (ideal schedule)", "",
                       sweep_markdown(sweeps[name]), "",
                       f"![{name} window]({name}-window.png)", ""]
                _plot_sweep(plt, out, name, sweeps[name])
        elif name == "control-plane":
            md += ["## control-plane", "", "| workers | farm episodes/s | plain RQ jobs/s | "
                   "ratio |", "|---:|---:|---:|---:|",
                   f"| {result['workers']} | {result['farm_episodes_per_s']} | "
                   f"{result['plain_rq_jobs_per_s']} | {result['ratio']} |", ""]
        elif name == "ledger":
            md += ["## ledger", "", "| clients | ledger ops/s | trivial script/s | ratio |",
                   "|---:|---:|---:|---:|",
                   f"| {result['clients']} | {result['ledger_ops_per_s']} | "
                   f"{result['trivial_script_per_s']} | {result['ratio']} |", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def sweep_markdown(sweep: list[dict[str, Any]]) -> str:
    lines = ["| max_staleness | window (batches) | group all-work (s) | sample all-work (s) | "
             "group occupancy | sample occupancy |", "|---:|---:|---:|---:|---:|---:|"]
    for row in sweep:
        lines.append(f"| {row['max_staleness']} | {row['max_staleness'] + 1} | "
                     f"{row['group']['all_work_completion_s']:.2f} | "
                     f"{row['sample']['all_work_completion_s']:.2f} | "
                     f"{row['group']['slot_occupancy']:.3f} | "
                     f"{row['sample']['slot_occupancy']:.3f} |")
    return "\n".join(lines)


def _plot_pilot(plt: Any, out: Path, name: str, runs: dict[str, ModeRun],
                result: dict[str, Any]) -> list[str]:
    colors = {"group": "tab:orange", "sample": "tab:blue"}
    labels = {"group": "group admission", "sample": "sample refill"}
    # active episodes over time, pause windows shaded
    fig, ax = plt.subplots(figsize=(9, 4))
    for mode, run in runs.items():
        timeline = run.active_timeline()
        xs, ys = zip(*timeline, strict=True)
        multi_turn = result.get("multi_turn") and run.in_flight
        ax.step(xs, ys, where="post", color=colors[mode], linewidth=1,
                label=labels[mode] + (": requests on the replicas" if multi_turn else ""),
                alpha=0.5 if multi_turn else 1.0)
        if multi_turn:
            xs, ys = zip(*run.in_flight, strict=True)
            ax.step(xs, ys, where="post", color=colors[mode], linewidth=1.5,
                    label=labels[mode] + ": episodes running (ledger, tool waits included)")
        for a, b in run.pauses:
            ax.axvspan(a, b, color=colors[mode], alpha=0.08)
    ax.axhline(next(iter(runs.values())).slots, color="grey", linestyle=":", label="slots")
    ax.set(xlabel="seconds since submit (measured)", ylabel="running episodes",
           title=f"{name}: active episodes (shaded: training pauses)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{name}-active.png", dpi=110)
    plt.close(fig)
    # batch-ready times
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, run in runs.items():
        ax.plot(range(1, len(run.ready) + 1), run.ready, marker="o", color=colors[mode],
                label=labels[mode])
    ax.set(xlabel="batch", ylabel="ready at (s since submit)", title=f"{name}: batch-ready times")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{name}-batches.png", dpi=110)
    plt.close(fig)
    # slot occupancy, measured and ideal
    fig, ax = plt.subplots(figsize=(6, 4))
    modes = list(runs)
    measured = [result["modes"][m]["slot_occupancy"] for m in modes]
    ideal = [result["modes"][m]["ideal"]["slot_occupancy"] for m in modes]
    x = range(len(modes))
    ax.bar([i - 0.2 for i in x], measured, 0.4, label="measured",
           color=[colors[m] for m in modes])
    ax.bar([i + 0.2 for i in x], ideal, 0.4, label="ideal schedule", color="lightgrey")
    ax.set_xticks(list(x), [labels[m] for m in modes])
    ax.set(ylim=(0, 1), ylabel="mean slot occupancy", title=f"{name}: slot occupancy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{name}-occupancy.png", dpi=110)
    plt.close(fig)
    return ["active", "batches", "occupancy"]


def _plot_sweep(plt: Any, out: Path, name: str, sweep: list[dict[str, Any]]) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    windows = [row["max_staleness"] for row in sweep]
    for mode, color in (("group", "tab:orange"), ("sample", "tab:blue")):
        ax1.plot(windows, [row[mode]["slot_occupancy"] for row in sweep], marker="o",
                 color=color, label=mode)
        ax2.plot(windows, [row[mode]["all_work_completion_s"] for row in sweep], marker="o",
                 color=color, label=mode)
    ax1.set(xlabel="max_staleness", ylabel="slot occupancy", ylim=(0, 1))
    ax2.set(xlabel="max_staleness", ylabel="all-work completion (s, measured scale)")
    ax1.legend()
    fig.suptitle(f"{name}: the staleness window, ideal schedule")
    fig.tight_layout()
    fig.savefig(out / f"{name}-window.png", dpi=110)
    plt.close(fig)
