"""The Prometheus exporter, run by the collector.

Counters and gauges are read from the ledger at scrape time, so they stay right across
collector restarts and failovers. Histograms are fed from the ledger's observations
stream (episode durations at ``finish``, batch and rollout intervals at ``pop_batch``,
consumed group staleness at ``ack``); a restarted exporter starts them afresh, as Prometheus
expects of a process restart. ``/metrics`` and ``/healthz`` listen on
``metrics.host:port`` (127.0.0.1 unless configured otherwise). Every series carries the
constant label ``farm="<farm.name>"``, so farms sharing a Prometheus stay apart.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from queue_rollout.config import Config
from queue_rollout.ledger.core import BLOCK_REASONS, Ledger
from queue_rollout.ledger.registry import Registry

log = logging.getLogger(__name__)
#: WSGI's start_response(status, headers)
StartResponse = Callable[[str, list[tuple[str, str]]], object]
P = "queue_rollout_"
#: The constant label of every series: the farm's name.
FARM_LABEL = "farm"
PLACEMENTS = ("one_replica", "split", "moved")
REJECT_REASONS = ("zero_variance", "failed_members", "plugin")
FAIL_REASONS = ("workflow", "oversized", "max_attempts")
RETRY_CAUSES = ("lease_expired", "worker_lost", "replica_restart", "generate_error",
                "doubt_timeout")


#: On a farm of cells, the counters the control Redis keeps for the farm (the cells
#: keep their own of these for their own groups); every other counter is the cells' sum.
FARM_COUNTERS = ("in_flight", "accepted", "consumed", "batches", "released", "acks_refused")


@dataclass
class Reading:
    """What one scrape reads of a ledger."""

    counters: dict[str, int]
    version: int
    paused: bool
    workers: dict[str, dict[str, Any]]
    capacity: int
    ready: int
    memory: int


def read_ledger(ledger: Ledger, config: Config) -> Reading:
    client, keys = ledger.client, ledger.keys
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.counters)
    pipe.hmget(keys.state, ["version", "paused"])
    pipe.llen(keys.ready)
    counters_raw, (version, paused), ready = pipe.execute()
    registry = Registry(client, keys, config.timeouts.lease)
    workers = registry.live()
    return Reading({k.decode(): int(v) for k, v in counters_raw.items()}, int(version or 0),
                   paused == b"1", workers, config.rollout.capacity_slots(registry.slots(workers)),
                   ready, int(client.info("memory").get("used_memory", 0)))


def farm_reading(control: Reading, cells: dict[str, Reading]) -> Reading:
    """A farm of cells as one: the version, pause flag, ready groups and the farm's
    group counters from the control Redis; the other counters, the workers, the
    capacity and Redis's memory summed over the cells (memory: and the control
    Redis)."""
    counters = Counter[str]()
    for part in cells.values():
        counters.update(part.counters)
    for name, value in control.counters.items():  # the control Redis's refusals too
        if name.startswith("blocked:"):
            counters[name] += value
    for name in FARM_COUNTERS:
        counters[name] = control.counters.get(name, 0)
    return Reading(dict(counters), control.version, control.paused,
                   {w: r for part in cells.values() for w, r in part.workers.items()},
                   sum(p.capacity for p in cells.values()), control.ready,
                   control.memory + sum(p.memory for p in cells.values()))


class LedgerCollector:
    """A prometheus_client collector that reads the ledger at each scrape; on a farm of
    cells, the control Redis's and every cell's (the farm summed, and a few figures of
    each cell labelled ``cell``)."""

    def __init__(self, ledger: Ledger, config: Config,
                 cells: dict[str, Ledger] | None = None) -> None:
        self.ledger, self.config, self.cells = ledger, config, cells or {}

    def _replicas_acked(self) -> int:
        """The last WAIT answer of the collector's changes; a farm that does not wait
        asks now (``WAIT 0 0`` answers at once: the replicas that caught up)."""
        durable = self.ledger.durable
        if durable is not None and durable.last_acked is not None:
            return durable.last_acked
        return int(self.ledger.client.execute_command("WAIT", 0, 0))

    def collect(self) -> Iterator[Metric]:
        reading = read_ledger(self.ledger, self.config)
        parts = {name: read_ledger(cell, self.config.for_cell(name))
                 for name, cell in self.cells.items()}
        if parts:
            reading = farm_reading(reading, parts)
            yield from _cell_gauges(parts)
        c, workers, capacity = reading.counters, reading.workers, reading.capacity

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(P + name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(P + name, doc, value=value)

        def labelled(name: str, doc: str, label: str, values: tuple[str, ...],
                     prefix: str) -> CounterMetricFamily:
            family = CounterMetricFamily(P + name, doc, labels=[label])
            for v in values:
                family.add_metric([v], c.get(f"{prefix}:{v}", 0))
            return family

        mode = GaugeMetricFamily(P + "admission_mode_info", "The admission mode: group, or "
                                 "sample (sample-level refill).", labels=["mode"])
        mode.add_metric([self.config.rollout.mode], 1)
        yield mode
        yield gauge("paused", "1 while the farm is paused (nothing admitted), else 0.",
                    int(reading.paused))
        yield gauge("sample_slots", "Episode slots (capacity; group mode: G per group).", capacity)
        yield gauge("sample_slots_reserved", "Episode slots reserved.", c.get("reserved", 0))
        yield gauge("active_episodes", "Running attempts.", c.get("running", 0))
        yield gauge("doubtful_attempts", "Attempts in doubt (slot kept).", c.get("doubtful", 0))
        yield gauge("tool_waits", "Running attempts waiting on a tool between turns (slot "
                    "kept, nothing generating).", c.get("tool_wait", 0))
        yield gauge("partial_groups", "Admitted groups with some members ended.",
                    c.get("partial", 0))
        yield gauge("policy_version", "The policy version.", reading.version)
        yield gauge("workers_alive", "Workers whose supervisor reported recently.", len(workers))
        slots = GaugeMetricFamily(P + "worker_slots", "Episode slots a live worker takes "
                                  "jobs for (its limit, with adaptive concurrency).",
                                  labels=["worker"])
        for worker, record in sorted(workers.items()):
            slots.add_metric([worker], int(record.get("slots", 0)))
        yield slots
        yield gauge("groups_in_flight", "Admitted groups not yet judged.", c.get("in_flight", 0))
        yield gauge("groups_ready", "Accepted groups waiting for a batch.", reading.ready)
        yield gauge("redis_used_memory_bytes", "Redis used_memory (a farm of cells: all its "
                    "servers').", reading.memory)
        yield gauge("redis_wait_replicas", "farm.redis_wait_replicas: replicas every ledger "
                    "change waits for.", self.config.farm.redis_wait_replicas)
        yield gauge("redis_replicas_acked", "Replicas that acknowledged the collector's "
                    "latest ledger change (WAIT's answer).", self._replicas_acked())
        yield counter("groups_admitted", "Groups admitted.", c.get("admitted", 0))
        yield counter("groups_accepted", "Groups accepted.", c.get("accepted", 0))
        yield counter("groups_consumed", "Groups consumed by trainers.", c.get("consumed", 0))
        yield counter("output_tokens", "Output tokens recorded.", c.get("output_tokens", 0))
        yield counter("turns", "Turns (requests to a replica) of recorded episodes.",
                      c.get("turns", 0))
        yield labelled("prefill_tokens", "Context tokens of recorded episodes the replicas "
                       "computed, or found in their prefix cache.", "kind",
                       ("computed", "cached"), "prefill")
        yield counter("batches_delivered", "Batches delivered.", c.get("batches", 0))
        yield counter("batches_released", "Unacknowledged batches released from their "
                      "consumer (release, timeouts.batch_ack) back to the ready groups.",
                      c.get("released", 0))
        yield counter("acks_refused", "Acknowledgements of a released batch, refused.",
                      c.get("acks_refused", 0))
        yield counter("notifications_ignored", "Duplicate or stale notifications refused.",
                      c.get("ignored", 0))
        yield labelled("groups_rejected", "Groups rejected, by reason.", "reason",
                       REJECT_REASONS, "rejected")
        yield labelled("admission_blocked", "Admission refusals, by reason.", "reason",
                       BLOCK_REASONS, "blocked")
        yield labelled("placements", "Placement: groups admitted onto one replica or split "
                       "over several, and placed attempts moved to the shared queue.", "how",
                       PLACEMENTS, "placements")
        yield labelled("attempt_retries", "Attempts retried, by cause.", "cause",
                       RETRY_CAUSES, "retries")
        finished = CounterMetricFamily(P + "episodes_finished", "Episodes ended, by outcome.",
                                       labels=["outcome"])
        finished.add_metric(["finished"], c.get("finished", 0))
        finished.add_metric(["failed"], c.get("failed", 0))
        yield finished
        yield labelled("episodes_failed", "Failed episodes, by reason.", "reason",
                       FAIL_REASONS, "failed")


def _cell_gauges(parts: dict[str, Reading]) -> Iterator[Metric]:
    """A few figures of each cell, labelled ``cell``."""
    for name, doc, value in (
            ("cell_sample_slots", "A cell's episode slots (capacity).",
             lambda r: r.capacity),
            ("cell_sample_slots_reserved", "A cell's episode slots reserved.",
             lambda r: r.counters.get("reserved", 0)),
            ("cell_active_episodes", "A cell's running attempts.",
             lambda r: r.counters.get("running", 0)),
            ("cell_doubtful_attempts", "A cell's attempts in doubt.",
             lambda r: r.counters.get("doubtful", 0)),
            ("cell_workers_alive", "A cell's live workers.", lambda r: len(r.workers)),
            ("cell_groups_in_flight", "A cell's admitted groups not yet judged.",
             lambda r: r.counters.get("in_flight", 0))):
        family = GaugeMetricFamily(P + name, doc, labels=["cell"])
        for cell, reading in sorted(parts.items()):
            family.add_metric([cell], value(reading))
        yield family


class ConstantLabels:
    """The metrics of the collectors registered in *source*, each sample with *labels*
    added (a sample's own label of the same name wins)."""

    def __init__(self, source: CollectorRegistry, labels: dict[str, str]) -> None:
        self.source, self.labels = source, labels

    def collect(self) -> Iterator[Metric]:
        for metric in self.source.collect():  # fresh objects at each collect: ours to edit
            metric.samples = [s._replace(labels={**self.labels, **s.labels})
                              for s in metric.samples]
            yield metric


class FarmMetrics:
    """The registry, the histograms and the HTTP endpoint. ``registry`` is what
    ``/metrics`` exports: the ledger's values and the histograms (registered in a
    private registry of their own), each series labelled ``farm``."""

    def __init__(self, ledger: Ledger, config: Config,
                 cells: dict[str, Ledger] | None = None) -> None:
        self.ledger, self.config = ledger, config
        source = CollectorRegistry()
        source.register(LedgerCollector(ledger, config, cells))
        self.registry = CollectorRegistry()
        self.registry.register(ConstantLabels(source, {FARM_LABEL: config.farm.name}))
        self.episode_duration = Histogram(
            P + "episode_duration_seconds", "Attempt start to result.", registry=source,
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf")))
        self.batch_interval = Histogram(
            P + "batch_interval_seconds", "Between successive batch deliveries.",
            registry=source,
            buckets=(1, 5, 10, 20, 30, 60, 120, 300, 600, 1200, float("inf")))
        self.rollout_interval = Histogram(
            P + "rollout_interval_seconds", "Between successive batch deliveries, less the "
            "pause in between (from the later of the last batch and the last resume).",
            registry=source,
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, float("inf")))
        self.staleness = Histogram(
            P + "consumed_group_staleness", "Policy versions between admission and consumption.",
            registry=source, buckets=(0, 1, 2, 3, 4, 6, 8, 16, float("inf")))
        self.tool_wait = Histogram(
            P + "tool_wait_seconds", "Each tool wait between turns of a recorded episode.",
            registry=source,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, float("inf")))
        # each server's stream (a farm of cells: the control Redis's has the batches',
        # the cells' the episodes'), from now: earlier observations belong to an
        # earlier exporter's histograms
        self._streams: list[tuple[Ledger, str]] = []
        for each in (ledger, *(cells or {}).values()):
            last = each.client.xrevrange(each.keys.observations, count=1)
            self._streams.append((each, last[0][0].decode() if last else "0-0"))
        self._server: WSGIServer | None = None

    def poll_observations(self) -> int:
        """Feed the histograms from the observations streams; returns entries read."""
        n = 0
        for i, (each, last_id) in enumerate(self._streams):
            read, self._streams[i] = self._poll(each, last_id)
            n += read
        return n

    def _poll(self, ledger: Ledger, last_id: str) -> tuple[int, tuple[Ledger, str]]:
        """The entries of *ledger*'s stream after *last_id* observed; (how many, the
        stream and its last id read)."""
        client, key = ledger.client, ledger.keys.observations
        n = 0
        while True:
            streams = client.xread({key: last_id}, count=1000)
            if not streams:
                return n, (ledger, last_id)
            for entry_id, fields in streams[0][1]:
                last_id = entry_id.decode()
                n += 1
                value = float(fields[b"v"])
                kind = fields[b"k"]
                if kind == b"episode_s":
                    self.episode_duration.observe(value)
                elif kind == b"batch_interval_s":
                    self.batch_interval.observe(value)
                elif kind == b"rollout_interval_s":
                    self.rollout_interval.observe(value)
                elif kind == b"staleness":
                    self.staleness.observe(value)
                elif kind == b"tool_s":
                    self.tool_wait.observe(value)

    def exposition(self) -> bytes:
        self.poll_observations()
        return generate_latest(self.registry)

    def healthy(self) -> bool:
        try:
            return bool(self.ledger.client.ping())
        except redis.RedisError:
            return False

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            ok = self.healthy()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"redis unreachable\n"]
        if path == "/metrics":
            try:
                body = self.exposition()
            except redis.RedisError as exc:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [f"redis unreachable: {type(exc).__name__}\n".encode()]
            start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
            return [body]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"try /metrics or /healthz\n"]

    def serve(self) -> int:
        """Serve on metrics.host:port from a daemon thread; returns the port. A port in
        use (or an address this host does not have) is a ConfigError naming the key."""
        from queue_rollout.errors import bind_failed

        m = self.config.metrics

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

        try:
            self._server = make_server(m.host, m.port, self._app, handler_class=Quiet)
        except OSError as exc:
            raise bind_failed("metrics.port", m.host, m.port, exc) from None
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="metrics").start()
        log.info("metrics on http://%s:%d/metrics", m.host, self._server.server_port)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
