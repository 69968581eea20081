"""Adaptive concurrency: how many episodes a replica's worker takes, from what the
replica says about its KV memory.

A replica whose running requests outgrow its KV pool retracts some of them (their
context is computed again when they run again); one whose requests are short leaves
memory idle. With ``engine.adaptive_slots`` each worker reads its replica's
``/metrics`` about once a second (SGLang exports them with ``--enable-metrics``; the
simulated replica exports the same names) and sets how many of its episode slots take
new jobs, between ``engine.min_slots_per_replica`` and ``engine.slots_per_replica``,
by additive increase and multiplicative decrease (AIMD):

- **Decrease** to ``limit x DECREASE`` (rounded down, not below the floor) when the
  replica retracted a request since the last look, or when its token usage is above
  ``HIGH_WATER``. Halving is TCP's choice: it empties room fast after a retraction, and
  the increase gives it back within seconds once the pressure is gone.
- **Increase** by ``INCREASE`` (up to the ceiling) when token usage is under the mark,
  nothing waits in the replica's queue and nothing was retracted: one slot a look, so
  a limit climbs from 1 to 16 in about 15 s, well within one long episode.
- **Come down to what the replica runs** (not below the floor) when requests wait in
  its queue at two looks in a row: a replica admits a request only when its KV pool
  has room for what the running ones may still grow to, so a queue that stays says the
  pool is full although usage may read well under the mark (SGLang reserves room it
  has not used yet). A slot whose request waits in that queue is a slot another
  replica could run; a queue seen once may be a request between arrival and its
  prefill.
- **Hold** otherwise (requests queued at one look only).

The mark is 0.90 of the pool: SGLang retracts when the next decode step does not fit,
that is at a usage of 1.0 less a few tokens per running request, so 0.90 leaves room
for one look's growth of 16 decoding requests (16 x about 130 tokens a second) on pools
of more than 21,000 tokens. A lower mark would act earlier, but hold slots back
from replicas whose long requests would have fitted.

Running episodes are never stopped for a lower limit: the limit applies to the next
job a slot would take. The controller is a pure function of its samples (no clock, no
I/O), so the worker and the virtual-time farm run the same code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

#: Token usage above which a replica's limit is decreased (a share of its KV pool).
HIGH_WATER = 0.90
#: The factor a limit is multiplied by on a retraction or above the mark.
DECREASE = 0.5
#: Slots a limit gains per look while the replica has room.
INCREASE = 1


@dataclass(frozen=True)
class MetricNames:
    """The names an engine exports what the controller reads under."""

    token_usage: str  # held KV, a share of the pool
    queued: str  # requests waiting
    running: str  # requests running
    retracted: str  # requests retracted (preempted) so far, a counter


#: SGLang's (``observability/metrics_collector.py``); the simulated replica's too.
SGLANG_METRICS = MetricNames("sglang:token_usage", "sglang:num_queue_reqs",
                             "sglang:num_running_reqs", "sglang:num_retracted_requests_total")
#: vLLM's (``v1/metrics/loggers.py``): a preemption is its retraction.
VLLM_METRICS = MetricNames("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                           "vllm:num_requests_running", "vllm:num_preemptions_total")
#: One sample line of the text format: a name, labels (quoted values may hold braces),
#: a value (a timestamp may follow).
_SAMPLE = re.compile(r'(?P<engine>sglang|vllm)[:_](?P<name>[A-Za-z0-9_:]+)'
                     r'(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(?P<value>\S+)')


@dataclass(frozen=True, slots=True)
class KvSignal:
    """One look at a replica: token usage (held tokens less the evictable cache, a
    share of the pool), requests waiting in its queue, requests retracted so far
    (SGLang exports the counter only after its first retraction: none before), and
    requests running (None where the replica does not say)."""

    token_usage: float
    queued: int
    retractions: int
    running: int | None = None


def _samples(text: str) -> Iterator[tuple[str, float]]:
    """Each finite SGLang or vLLM sample of a Prometheus text exposition, as (name,
    value); ``sglang_`` names (as a router that rewrites the colon serves them) read as
    ``sglang:`` ones."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if math.isfinite(value):
            yield f"{m['engine']}:{m['name']}", value


def metric_totals(text: str) -> dict[str, float]:
    """Every SGLang or vLLM metric of a Prometheus text exposition, its series (ranks,
    labels) added up, by name."""
    totals: dict[str, float] = {}
    for name, value in _samples(text):
        totals[name] = totals.get(name, 0.0) + value
    return totals


def parse_metrics(text: str, names: MetricNames = SGLANG_METRICS) -> KvSignal | None:
    """The signal in a Prometheus text exposition; None when it lacks token usage or the
    queue (a replica started without ``--enable-metrics`` answers 404, an old one may
    lack the retraction counter: it then counts as none). Several series of one name
    (ranks) add up, and token usage takes the fullest: the controller asks only
    whether anything is queued or was retracted, which a sum over ranks that each
    count the same requests still tells."""
    usage: list[float] = []
    queued = retracted = running = 0.0
    found_queue = found_running = False
    for name, value in _samples(text):
        if name == names.token_usage:
            usage.append(value)
        elif name == names.queued:
            queued += value
            found_queue = True
        elif name == names.retracted:
            retracted += value
        elif name == names.running:
            running += value
            found_running = True
    if not usage or not found_queue:
        return None
    return KvSignal(max(usage), int(queued), int(retracted),
                    int(running) if found_running else None)


@dataclass
class SlotLimit:
    """A replica's limit under AIMD; starts at the ceiling."""

    ceiling: int
    floor: int = 1
    limit: int = field(init=False)
    _retractions: int | None = field(default=None, init=False)
    _queued: bool = field(default=False, init=False)  # requests waited at the last look

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"a floor of {self.floor} slots is not in 1..{self.ceiling}")
        self.limit = self.ceiling

    def observe(self, signal: KvSignal) -> int:
        """The limit after one look at the replica."""
        last, self._retractions = self._retractions, signal.retractions
        # a lower count than last time: the replica restarted (its counters did)
        retracted = last is not None and signal.retractions > last
        queued_before, self._queued = self._queued, signal.queued > 0
        if retracted or signal.token_usage > HIGH_WATER:
            self.limit = max(self.floor, math.floor(self.limit * DECREASE))
        elif queued_before and self._queued:
            runs = (signal.running if signal.running is not None
                    else math.floor(self.limit * DECREASE))
            self.limit = max(self.floor, min(self.limit, runs))
        elif signal.queued == 0:
            self.limit = min(self.ceiling, self.limit + INCREASE)
        return self.limit
