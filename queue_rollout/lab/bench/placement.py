"""The long-prompt pilot's runs (its profile: ``LONG_PROMPT``, in
:mod:`queue_rollout.lab.workloads.pilots`): where a group's members run decides how
often its prompt is computed.

Each group has a prompt of its own (4,096 reference tokens) and the long tail's outputs
(seven 1,024-token members and one 16,384-token one). A replica keeps what it computed
in its prefix cache, so members that share a replica find their prompt there; members
that land on different replicas each compute it. Both admission modes run with
``rollout.placement = "any"`` and ``"group"`` over one manifest, through the real stack
(audited) beside the ideal schedule of each. A prefill round holds at most
``chunked_prefill_size`` tokens (8,192 reference tokens, two prompts): members arriving
together are computed together, so on one replica a group computes its prompt at most
about twice; the next round finds it cached.
"""

from __future__ import annotations

from typing import Any

from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import Bench, run_audited
from queue_rollout.lab.bench.results import changes, mode_json, shape_json
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile

#: The runs, in order: (admission mode, placement).
RUNS = (("group", "any"), ("group", "group"), ("sample", "any"), ("sample", "group"))


def prefill_figures(computed: int, cached: int, groups: int, prompt_tokens: int
                    ) -> dict[str, float | int | None]:
    """Prefill tokens the replicas computed and found cached, in all and per group;
    how many prompts' worth each group computed; the share found cached."""
    total = computed + cached
    per_group = computed / groups if groups else None
    return {
        "prefill_tokens_computed": computed, "prefill_tokens_cached": cached,
        "prefill_tokens_computed_per_group": None if per_group is None else round(per_group, 1),
        "prefill_tokens_cached_per_group": round(cached / groups, 1) if groups else None,
        "prompt_computations_per_group": (None if per_group is None or not prompt_tokens
                                          else round(per_group / prompt_tokens, 3)),
        "cache_hit_rate": round(cached / total, 4) if total else None,
    }


def run_json(run: ModeRun, shape: Shape, scale: Scale, prompt_tokens: int) -> dict[str, Any]:
    """One run's figures: its mode's, its prefill (the ledger's counters, from the
    replicas' ``meta_info``) and placements, and the same for its ideal schedule."""
    out = mode_json(run, scale, shape, multi_turn=False)
    c, groups = run.counters, len(run.delivered)
    out.update(prefill_figures(c.get("prefill:computed", 0), c.get("prefill:cached", 0),
                               groups, prompt_tokens))
    out["placements"] = {how: c.get(f"placements:{how}", 0)
                         for how in ("one_replica", "split", "moved")}
    if run.ideal is not None:
        ideal = out["ideal"]
        ideal.update(prefill_figures(run.ideal.prefill_tokens, run.ideal.cached_tokens,
                                     groups, prompt_tokens))
        ideal["placements"] = dict(run.ideal.placements)
    return out


def placement_json(profile: Profile, shape: Shape, scale: Scale, max_staleness: int,
                   runs: dict[str, ModeRun]) -> dict[str, Any]:
    prompt_tokens = scale.length(profile.prompt_tokens)
    by_run = {key: run_json(run, shape, scale, prompt_tokens) for key, run in runs.items()}
    out: dict[str, Any] = {
        "profile": profile.name, "scale": scale.as_json(),
        "shape": {**shape_json(shape, max_staleness), "prompt_tokens": prompt_tokens,
                  "chunked_prefill_size": scale.length(shape.chunked_prefill_size)},
        "runs": by_run,
        # "group" placement against "any", per admission mode
        "change": {}, "ideal_change": {}}
    for mode in ("group", "sample"):
        any_, grouped = by_run[f"{mode}/any"], by_run[f"{mode}/group"]
        out["change"][mode] = {**changes(any_, grouped), **_ratios(any_, grouped)}
        out["ideal_change"][mode] = {**changes(any_["ideal"], grouped["ideal"]),
                                     **_ratios(any_["ideal"], grouped["ideal"])}
    return out


def _ratios(any_: dict[str, Any], grouped: dict[str, Any]) -> dict[str, float | None]:
    """The prefill computed per group, and the cache hit rate's difference (a share)."""
    k, hit = "prefill_tokens_computed_per_group", "cache_hit_rate"
    return {k: round(grouped[k] / any_[k] - 1, 4) if any_.get(k) and grouped.get(k) is not None
            else None,
            "cache_hit_rate_difference": (round(grouped[hit] - any_[hit], 4)
                                          if None not in (grouped.get(hit), any_.get(hit))
                                          else None)}


def run_long_prompt(bench: Bench, profile: Profile, max_staleness: int
                    ) -> tuple[dict[str, Any], dict[str, ModeRun]]:
    """Both modes with each placement over one manifest; audited
    (:func:`~.pilot.run_audited`)."""
    runs = run_audited(bench, profile, max_staleness,
                       {f"{mode}/{placement}": {"mode": mode, "placement": placement}
                        for mode, placement in RUNS})
    return placement_json(profile, bench.shape, bench.scale, max_staleness, runs), runs
