"""What ``plan`` prints: a table of its runs, the recommendation, and with ``--out`` a
markdown report with plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from queue_rollout.lab.plots import pyplot

#: Settings whose mean rollout interval is within this share of the best count as
#: equally fast; among them the least stale wins (the model is deterministic, but a
#: real farm's noise is larger than this).
TIE = 0.01

COLUMNS = (("mode", "mode", "{}"), ("max_staleness", "stale", "{}"),
           ("mean_rollout_interval_s", "interval s", "{:,.2f}"),
           ("all_work_completion_s", "all-work s", "{:,.1f}"),
           ("accepted_groups_per_hour", "groups/h", "{:,.1f}"),
           ("slot_occupancy", "occupancy", "{:.3f}"),
           ("mean_consumed_staleness", "staleness", "{:.2f}"),
           ("retractions", "retractions", "{:,}"))
#: Added when a setting places groups: where a group runs decides its prefill.
PLACEMENT_COLUMNS = (("placement", "placement", "{}"),
                     ("prefill_tokens_per_group", "prefill/group", "{:,.0f}"),
                     ("cache_hit_rate", "cache hits", "{:.3f}"))


#: Added when a setting has adaptive slots: the workers' limits, summed, time-averaged.
SLOTS_COLUMNS = (("slots", "slots", "{}"), ("mean_slots_limit", "mean limit", "{:,.1f}"))


def columns(rows: list[dict[str, Any]]) -> tuple[tuple[str, str, str], ...]:
    """The table's columns: the placement's when any row places groups, the slots'
    when any row has adaptive slots."""
    extra: tuple[tuple[str, str, str], ...] = ()
    if any(row.get("placement", "any") != "any" for row in rows):
        extra += PLACEMENT_COLUMNS
    if any(row.get("slots", "fixed") != "fixed" for row in rows):
        extra += SLOTS_COLUMNS
    return COLUMNS[:2] + extra + COLUMNS[2:]


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return fmt.format(value)


def table(rows: list[dict[str, Any]]) -> str:
    cols = columns(rows)
    head = [title for _, title, _ in cols]
    body = [[_cell(row.get(key), fmt) for key, _, fmt in cols] for row in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    cols = columns(rows)
    lines = ["| " + " | ".join(title for _, title, _ in cols) + " |",
             "|" + "---|" * 2 + "---:|" * (len(cols) - 2)]
    lines += ["| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in cols) + " |"
              for row in rows]
    return "\n".join(lines)


def _speed(row: dict[str, Any]) -> float:
    """What ranks settings: the mean rollout interval, else (no trained batches after
    the first) the time to complete every group."""
    value = row.get("mean_rollout_interval_s")
    return float(value if value is not None else row["all_work_completion_s"])


def _name(row: dict[str, Any]) -> str:
    mode = "sample-level refill" if row["mode"] == "sample" else "group admission"
    placed = " with placement = \"group\"" if row.get("placement", "any") == "group" else ""
    adaptive = " and adaptive slots" if row.get("slots", "fixed") == "adaptive" else ""
    return f"{mode} at max_staleness {row['max_staleness']}{placed}{adaptive}"


def recommend(rows: list[dict[str, Any]], baseline: dict[str, Any]
              ) -> tuple[dict[str, Any], str]:
    """The best setting and one line: its gain against *baseline* (the configured
    setting under group admission) and what it costs in staleness."""
    best_speed = min(_speed(r) for r in rows)
    fast = [r for r in rows if _speed(r) <= best_speed * (1 + TIE)]
    # among equally fast settings: the least stale, group admission, the smallest
    # window, then the least prefill computed (placement), then fixed slots
    best = min(fast, key=lambda r: (r.get("mean_consumed_staleness") or 0.0,
                                    r["mode"] != "group", r["max_staleness"],
                                    r.get("prefill_tokens_per_group") or 0.0,
                                    r.get("slots", "fixed") != "fixed"))
    what = ("mean rollout interval" if best.get("mean_rollout_interval_s") is not None
            else "time to complete every group")
    if best is baseline:
        others = [r for r in rows if r is not baseline]
        nearest = min(others, key=_speed) if others else None
        tail = (f"; the next best, {_name(nearest)}, "
                f"{_speed(nearest) / _speed(baseline) - 1:+.1%}" if nearest else "")
        return best, (f"recommendation: keep {_name(best)}: no setting shortens the {what} "
                      f"by more than {TIE:.0%}{tail}")
    change = _speed(best) / _speed(baseline) - 1
    stale, base_stale = best.get("mean_consumed_staleness"), baseline.get(
        "mean_consumed_staleness")
    cost = ("" if stale is None or base_stale is None else
            f"; consumed groups {stale - base_stale:+.2f} versions staler on average "
            f"({stale:.2f} against {base_stale:.2f})")
    return best, (f"recommendation: {_name(best)}: {what} {_speed(best):,.2f} s, "
                  f"{change:+.1%} against {_name(baseline)}{cost}")


def write_report(out: Path, rows: list[dict[str, Any]], lines: list[str],
                 command: str) -> Path:
    """``plan.md`` with plots of the interval and the staleness per setting."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    labels = [f"{r['mode']}\ns={r['max_staleness']}"
              + ("\nplaced" if r.get("placement", "any") == "group" else "")
              + ("\nadaptive" if r.get("slots", "fixed") == "adaptive" else "") for r in rows]
    for name, key, ylabel in (
            ("interval", None, "mean rollout interval (s)"),
            ("staleness", "mean_consumed_staleness", "mean staleness of consumed groups")):
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows)), 3.2))
        values = [_speed(r) if key is None else (r.get(key) or 0.0) for r in rows]
        ax.bar(labels, values, color=["#4c72b0" if r["mode"] == "group" else "#dd8452"
                                      for r in rows])
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(out / f"plan-{name}.png", dpi=110)
        plt.close(fig)
    md = ["# queue-rollout plan", "", f"Command: `{command}`", "", *lines, "",
          markdown_table(rows), "", "![interval](plan-interval.png)", "",
          "![staleness](plan-staleness.png)", ""]
    path = out / "plan.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return path
