"""Every pilot by name: the synthetic ones, the seed's workloads, and those the bench
runs several times each (placement's, adaptive concurrency's)."""

from __future__ import annotations

from queue_rollout.lab.workloads.pilots import KV_PRESSURE, LONG_PROMPT, PILOTS
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.lab.workloads.seed import SEED_PILOTS

#: Profiles of several runs each: placement's, adaptive concurrency's.
MULTI_RUN = {LONG_PROMPT.name: LONG_PROMPT, KV_PRESSURE.name: KV_PRESSURE}
#: Every pilot: the synthetic ones, the seed's workloads, those of several runs.
PILOT_NAMES = (*PILOTS, *SEED_PILOTS, *MULTI_RUN)


def pilot_profile(name: str) -> Profile:
    """The pilot named *name* (one of :data:`PILOT_NAMES`); KeyError for another."""
    if name in MULTI_RUN:
        return MULTI_RUN[name]
    return PILOTS[name] if name in PILOTS else SEED_PILOTS[name]()
