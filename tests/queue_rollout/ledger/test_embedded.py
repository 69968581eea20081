"""The embedded redis-server: private port, AOF under state_dir, URL file."""

from __future__ import annotations

import redis

from queue_rollout.config import Config, FarmConfig
from queue_rollout.ledger.connection import resolve_url
from queue_rollout.ledger.embedded import EmbeddedRedis, find_redis_server


def test_embedded_redis_writes_its_url_keeps_aof_and_survives_a_crash(state_dir):
    server = EmbeddedRedis(state_dir)
    url = server.start()
    try:
        assert server.port != 6379 and url.startswith("redis://127.0.0.1:")
        config = Config(farm=FarmConfig(state_dir=str(state_dir)))
        assert resolve_url(config) == url  # other commands find it
        client = redis.Redis.from_url(url)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        client.set("kept", "1")
        client.execute_command("CONFIG", "SET", "appendfsync", "always")
        client.set("kept-always", "1")
        server.restart()  # SIGKILL, then start on the same port and data
        assert client.get("kept-always") == b"1"
        client.close()
    finally:
        server.stop()
    assert not (state_dir / "redis.url").exists()
    assert (state_dir / "redis").is_dir()


def test_a_binary_is_found():
    assert find_redis_server()
