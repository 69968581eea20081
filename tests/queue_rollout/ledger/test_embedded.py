"""The embedded redis-server: private port, AOF under state_dir, URL file."""

from __future__ import annotations

import subprocess

import pytest
import redis

from queue_rollout.config import Config, FarmConfig
from queue_rollout.errors import ConfigError
from queue_rollout.ledger.connection import resolve_url
from queue_rollout.ledger.embedded import EmbeddedRedis, find_redis_server
from queue_rollout.procs import port_holder
from testkit import wait_for


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


def test_a_farm_s_redis_keeps_its_port_and_names_who_holds_it_when_taken(state_dir):
    """With keep_port the first port is recorded under state_dir and taken again by every
    later start (a client made before the restart carries on); a recorded port that
    another process holds is refused, naming the port and that process."""
    first = EmbeddedRedis(state_dir, keep_port=True)
    url = first.start()
    client = redis.Redis.from_url(url)
    client.set("before", "1")
    first.kill()  # a hard stop of its launcher
    again = EmbeddedRedis(state_dir, keep_port=True)
    try:
        assert again.start() == url
        assert client.get("before") == b"1"  # the same client, after the restart
    finally:
        again.stop()
        client.close()
    holder = subprocess.Popen([find_redis_server(), "--port", str(first.port), "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_holder(first.port), 10, "the other redis-server to listen")
        with pytest.raises(ConfigError) as refused:
            EmbeddedRedis(state_dir, keep_port=True).start()
    finally:
        holder.terminate()
        holder.wait()
    message = str(refused.value)
    assert f"port {first.port} (recorded in {state_dir / 'redis' / 'port'}) is taken" in message
    assert f"by pid {holder.pid} (" in message and "redis-server" in message
