"""Shared fixtures: a private redis-server per test session (so one per pytest-xdist
worker: ``pytest -n auto``), a clean database per test;
the Hypothesis profile (``HYPOTHESIS_PROFILE``: ``fast`` by default, ``ci`` in CI).

The server is started by the same launcher the embedded farm uses
(:class:`queue_rollout.ledger.embedded.EmbeddedRedis`) on a free port; it never touches the
machine's own Redis on 6379.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from faultfarm import SHARED_REPLICAS, SLOTS, FaultServer, restore
from hypothesis import settings
from real_engine.server import (
    AREAL_PYTHON_ENV,
    AREAL_VERSION,
    CACHE,
    INSTALL_HINT,
    RealServer,
    find_areal_python,
    find_sglang_python,
    model,
)
from real_engine.vllm_server import VLLM_INSTALL_HINT, VLLMServer, find_vllm_python, untied_model

from queue_rollout.config import RolloutConfig
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import EmbeddedRedis
from testkit import greedy

# fast: the same examples every run, fewer of them (testkit.examples); ci: new ones from a
# new seed each run, as many as each test asks for
settings.register_profile("fast", derandomize=True, database=None, deadline=None)
settings.register_profile("ci", database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), write_url=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def real_sglang(replicas: list[FaultServer]) -> FaultServer:
    """A real SGLang server on this machine's CPU serving the tiny model of seed 0: the
    first of the session's two shared replicas, serving, resumed and on its own weights
    (a test that changes them leaves them to the next one's restore). Without SGLang the
    tests skip saying how to install it; in CI (``CI=true``) that is a failure."""
    return replicas[0]


@pytest.fixture(scope="session")
def other_weights_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """A real SGLang server started with the other weights (the tiny model of seed 1) and
    a KV pool of 2,048 tokens. Its greedy output (:func:`testkit.greedy`), taken first
    thing, is the reference a server that loaded those weights by a weight update must
    match; its small pool makes long requests queue. After the session the
    ``sgl_kernel`` stand-in's call file must be empty."""
    python = _sglang_or_skip()
    server = RealServer(python, model(python, seed=1), tmp_path_factory.mktemp("sglang-s1"),
                        max_total_tokens=2048)
    with server.serving():
        server.reference = greedy(SGLangClient(server.url, timeout=120), "reference").output_ids
        yield server


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python that has vLLM (the test skips without one, and fails in CI)."""
    return or_skip(find_vllm_python(), VLLM_INSTALL_HINT)


@pytest.fixture(scope="session")
def real_vllm(vllm_python: str, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[VLLMServer]:
    """A real vLLM server on this machine's CPU serving the untied tiny model of seed 0,
    for the session; the untied model of seed 1 (``other_weights``) is made beside it."""
    server = VLLMServer(vllm_python, untied_model(vllm_python, 0),
                        tmp_path_factory.mktemp("vllm-s0"))
    untied_model(vllm_python, 1)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_replicas(real_vllm: VLLMServer, vllm_python: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VLLMServer]]:
    """Two real vLLM servers on the tiny untied model of seed 0: the session's
    :func:`real_vllm` and one more."""
    second = VLLMServer(vllm_python, real_vllm.model_path, tmp_path_factory.mktemp("vllm-b"))
    second.start()
    try:
        yield [real_vllm, second]
    finally:
        second.stop()


@pytest.fixture
def real_sglang_small_kv(other_weights_server: RealServer) -> RealServer:
    """A real SGLang server whose KV pool holds 2,048 tokens (:func:`other_weights_server`:
    the model it serves does not matter there)."""
    return other_weights_server


@dataclass
class Replica:
    """A replica to run requests on: the simulated one (fast tier) or the session's
    real SGLang server (``pytest -m sglang``)."""

    url: str
    other_weights: str  # a model_path a weight update may load
    long: int  # output tokens that run a few seconds on it
    reference: list[int] | None  # the other weights' greedy output, from a fresh server


@pytest.fixture(params=["sim", pytest.param("sglang", marks=pytest.mark.sglang)])
def replica(request: pytest.FixtureRequest) -> Iterator[Replica]:
    if request.param == "sim":
        other = request.getfixturevalue("tmp_path") / "other-weights"  # a folder, as SGLang needs
        other.mkdir()
        with ThreadedSimEngine(slots=8, step_ms=20.0) as sim:
            yield Replica(sim.url, str(other), 150, None)
    else:
        real = request.getfixturevalue("real_sglang")
        yield Replica(real.url, str(real.other_weights), 1500,
                      request.getfixturevalue("other_weights_greedy"))


@pytest.fixture
def other_weights_greedy(other_weights_server: RealServer) -> list[int]:
    """The greedy output (:func:`testkit.greedy`) of the weights a weight update loads
    (seed 1), from a server started with them: the reference a server whose weights
    were updated must match."""
    assert other_weights_server.reference is not None
    return other_weights_server.reference


@pytest.fixture(scope="session")
def shared_replicas(tmp_path_factory: pytest.TempPathFactory,
                    sglang_interpreter: str) -> Iterator[list[FaultServer]]:
    """Two real SGLang replicas (seed-0 model, :data:`faultfarm.SLOTS` running requests
    each), shared by the session's tests of whole farms on real replicas; stopped at the
    end with no call of the ``sgl_kernel`` stand-in recorded."""
    python = sglang_interpreter
    made = [FaultServer(python, model(python, 0), tmp_path_factory.mktemp(f"replica{i}"),
                        max_running=SLOTS, other_weights=model(python, 1)) for i in range(2)]
    began = time.monotonic()
    # one after the other, from this thread: a server dies with the thread that started
    # it (PR_SET_PDEATHSIG), and two starting at once take as long on 2 cores
    SHARED_REPLICAS[:] = made
    try:
        for server in made:
            server.start()
        print(f"\n2 replicas healthy after {time.monotonic() - began:.0f} s", flush=True)
        yield made
    finally:
        for server in made:
            server.stop()
        SHARED_REPLICAS.clear()
    for server in made:
        assert not server.stand_in_calls(), server.stand_in_calls()


@pytest.fixture
def replicas(shared_replicas: list[FaultServer]) -> list[FaultServer]:
    """The shared replicas, each serving (started again if a test left it dead), not
    paused, with the seed-0 weights under the version name SGLang starts with."""
    for server in shared_replicas:
        server.ensure_serving()
        restore(server)
    return shared_replicas


@pytest.fixture(scope="session")
def sglang_interpreter() -> str:
    """The Python that has SGLang (the test skips without one, and fails in CI)."""
    return _sglang_or_skip()


@pytest.fixture(scope="session")
def areal_python() -> str:
    """The Python of the venv that has AReaL's API modules (the test skips without one,
    and fails in CI)."""
    return or_skip(find_areal_python(),
                   f"no AReaL: make its venv as .ci/run does ({CACHE}/areal-{AREAL_VERSION}, "
                   f"this checkout installed there) or name its Python in {AREAL_PYTHON_ENV}")


def _sglang_or_skip() -> str:
    """The Python that has SGLang; without one the test skips saying how to install it,
    and fails in CI (``CI=true``)."""
    return or_skip(find_sglang_python(), INSTALL_HINT)


def or_skip(python: str | None, hint: str) -> str:
    """*python*; where there is none the test skips with *hint*, and fails in CI
    (``CI=true``)."""
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail(hint)
        pytest.skip(hint)
    return python


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_ledger(r: redis.Redis, clock: ManualClock):
    """``make_ledger(**rollout_fields)`` -> a Ledger on farm "t" with the fake clock."""

    def make(farm: str = "t", **fields: object) -> Ledger:
        return Ledger(r, farm, RolloutConfig(**fields), clock=clock)  # type: ignore[arg-type]

    return make


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


RedisSnapshot = dict[bytes, tuple[bytes, bool, bytes]]


@pytest.fixture
def redis_snapshot(r: redis.Redis) -> Callable[[], RedisSnapshot]:
    """``redis_snapshot()`` -> every key of the test's database (farm keys and RQ's)
    with its type, whether it expires, and its DUMP: equal snapshots mean nothing was
    written."""

    def snapshot() -> RedisSnapshot:
        return {key: (r.type(key), r.pttl(key) >= 0, r.dump(key))
                for key in r.scan_iter(count=1000)}

    return snapshot
