"""The worker's side of adaptive concurrency: the supervisor's controller against a
replica's /metrics (read, absent, unreachable) and the episode processes' share."""

from __future__ import annotations

import http.server
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest

from queue_rollout.config import EngineConfig
from queue_rollout.engines.concurrency import HIGH_WATER
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.ledger.embedded import free_port
from queue_rollout.workers.limits import NO_METRICS_RETRY_S, AdaptiveLimit, LimitFile, SlotGate
from testkit import Generating


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def metrics_server(pages: list[tuple[int, str]]) -> Iterator[str]:
    """An HTTP server whose /metrics answers *pages* in turn (the last one again)."""
    asked: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = pages[min(len(asked), len(pages) - 1)]
            asked.append(status)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def page(usage: float, queued: int = 0, retracted: int = 0) -> tuple[int, str]:
    return 200, (f'sglang:token_usage{{model_name="m"}} {usage}\n'
                 f'sglang:num_queue_reqs{{model_name="m"}} {queued}\n'
                 f'sglang:num_retracted_requests_total{{model_name="m"}} {retracted}\n')


ENGINE = msgspec.convert({"slots_per_replica": 8, "min_slots_per_replica": 2}, EngineConfig)


def test_the_limit_follows_the_replica_s_metrics():
    pages = [page(0.3), page(HIGH_WATER + 0.05), page(0.95, retracted=1), page(0.5, 2),
             page(0.4), page(0.4)]
    with metrics_server(pages) as url:
        limit = AdaptiveLimit(ENGINE, SGLangClient(url), "w")
        assert [limit.look() for _ in pages] == [8, 4, 2, 2, 3, 4]


def test_a_replica_without_metrics_is_logged_once_keeps_the_ceiling_and_is_asked_again(
        caplog):
    clock = Clock()
    with metrics_server([page(0.95), (404, "not found"), (404, "not found"),
                         page(0.95)]) as url:
        limit = AdaptiveLimit(ENGINE, SGLangClient(url), "w", clock=clock)
        with caplog.at_level(logging.INFO):
            assert limit.look() == 4
            assert limit.look() == 8  # 404: the ceiling
            assert limit.look() == 8  # not asked again yet
            clock.now += NO_METRICS_RETRY_S
            assert limit.look() == 8  # asked: 404 again, logged no more
            clock.now += NO_METRICS_RETRY_S
            assert limit.look() == 4  # metrics again: followed again
    warnings = [r for r in caplog.records if "exports no KV metrics" in r.getMessage()]
    assert len(warnings) == 1 and "--enable-metrics" in warnings[0].getMessage()


def test_an_unreachable_replica_keeps_the_last_limit_and_is_logged_once_per_outage(caplog):
    client = SGLangClient(f"http://127.0.0.1:{free_port()}")  # nothing listens
    limit = AdaptiveLimit(ENGINE, client, "w")
    limit.control.limit = 5
    with caplog.at_level(logging.WARNING):
        assert [limit.look() for _ in range(3)] == [5, 5, 5]
    assert sum("cannot read the replica's metrics" in r.getMessage()
               for r in caplog.records) == 1


def test_each_episode_process_takes_its_share_of_the_limit_counted_from_the_first():
    clock = Clock()
    file = LimitFile(5)
    try:
        gates = [SlotGate(str(file.path), first, 4, clock=clock) for first in (0, 4, 8)]
        assert [g.share() for g in gates] == [4, 1, 0]
        file.write(9)
        assert [g.share() for g in gates] == [4, 1, 0]  # read again only after a while
        clock.now += 1.0
        assert [g.share() for g in gates] == [4, 4, 1]
        file.path.write_text("garbage")
        clock.now += 1.0
        assert [g.share() for g in gates] == [4, 4, 1]  # unreadable: the last share
    finally:
        file.remove()
    assert not file.dir.exists()
    assert SlotGate("", 0, 3).share() == 3  # no limit file: every slot


@pytest.mark.sglang
def test_the_limit_comes_down_on_a_real_server_whose_kv_pool_queues_requests(
        real_sglang_small_kv, caplog):
    """SGLang admits a request only when its pool has room for what the running ones may
    still grow to: eight long requests on a 2,048-token pool run two or three at a time,
    the rest wait while token usage reads under the mark, and no request is retracted.
    The queue, seen at two looks in a row, brings the limit down to what runs; the
    change is logged with the signal that made it."""
    caplog.set_level(logging.INFO, "queue_rollout.workers.limits")
    engine = msgspec.convert({"slots_per_replica": 8}, EngineConfig)
    client = SGLangClient(real_sglang_small_kv.url, timeout=30)
    adaptive = AdaptiveLimit(engine, client, "kv")
    episodes = Generating(client, [f"kv-{i}" for i in range(8)], 1000)
    limits = []
    while len(episodes.answers) < 8 and len(limits) < 120:
        limits.append(adaptive.look())
        time.sleep(0.25)
    episodes.join()
    assert min(limits) < 8
    first = re.search(r"limit 8 -> (\d+) slots \(token usage ([\d.]+), (\d+) running, "
                      r"(\d+) queued, (\d+) retractions", caplog.text)
    assert first is not None, caplog.text
    limit, usage, runs, queued, retractions = first.groups()
    assert float(usage) <= HIGH_WATER and int(retractions) == 0 and int(queued) > 0
    assert int(limit) == max(1, int(runs))
