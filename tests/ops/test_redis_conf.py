"""ops/redis.conf and ops/users.acl on a real redis-server, and the farm under the ACL users.

The server is started from ops/redis.conf itself, with only what must differ on a test
machine overridden on the command line (port, bind, data dir, ACL file), and with a
copy of ops/users.acl whose placeholders (farm name, password hashes) are filled in as
ops/README.md tells an operator to. Then the farm runs end to end, each component
connecting as its own ACL user through the package's own code: the trainer submits and
consumes, the collector admits, dispatches, judges and exports metrics, a real
``queue-rollout worker`` process runs the episodes on a simulated replica. Redis's ACL
log must stay empty throughout (a refusal the package swallows still shows there),
every user must be refused outside its scope, and the ledger must come back whole from
the AOF after a crash (which these ACLs can break: see the crash test).

Never touches the Redis on 6379: the port is free_port()'s.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from queue_rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.collector.metrics import LedgerCollector
from queue_rollout.config import RolloutConfig, load_config
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.errors import LedgerError, RedisUnavailable
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.keys import Keys
from queue_rollout.results import EpisodeResult, encode_result
from testkit import G2_B2, wait_for, write_farm

OPS = Path(__file__).resolve().parents[2] / "ops"
EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
ROLES = ("admin", "collector", "worker", "trainer")
FARM = "opsfarm"


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH: cannot check ops/redis.conf "
                    "(apt-get install redis-server, Redis 7.0 or newer)")
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\d+)\.(\d+)", out)
    if m is None or (int(m.group(1)), int(m.group(2))) < (7, 0):
        pytest.skip(f"ops/redis.conf needs Redis 7.0 or newer; {binary} is: {out.strip()}")
    return binary


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render_acl(farm: str, passwords: dict[str, str]) -> str:
    """ops/users.acl with its placeholders filled in, as ops/README.md says."""
    text = (OPS / "users.acl").read_text()
    for role, password in passwords.items():
        placeholder = f"#{role.upper()}_PASSWORD_SHA256"
        assert placeholder in text, f"users.acl has no {placeholder}"
        text = text.replace(placeholder, "#" + sha256(password))
    assert "{myfarm}" in text
    return text.replace("{myfarm}", "{" + farm + "}")


class OpsRedis:
    """redis-server on ops/redis.conf, with test-machine overrides on the command line."""

    def __init__(self, root: Path, acl_text: str, passwords: dict[str, str]) -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(parents=True)
        self.aclfile = root / "users.acl"
        self.aclfile.write_text(acl_text)
        self.aclfile.chmod(0o600)
        self.log = root / "redis.log"
        self.passwords = passwords
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def argv(self, port: int) -> list[str]:
        return [redis_server_binary(), str(OPS / "redis.conf"),
                "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.data),
                "--aclfile", str(self.aclfile), "--supervised", "no",
                "--daemonize", "no"]

    def start(self) -> None:
        for _ in range(5):  # a free port may be taken between the probe and the bind
            self.port = free_port()
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(self.argv(self.port), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            if self.ready():
                return
            self.stop()
        raise AssertionError(f"redis-server did not start on ops/redis.conf:\n{self.tail()}")

    def ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with self.client("admin") as c:
                    if c.ping():
                        return True
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.05)
        return False

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])

    def url(self, role: str, password: str | None = None) -> str:
        return (f"redis://{role}:{password or self.passwords[role]}"
                f"@127.0.0.1:{self.port}/0")

    def client(self, role: str, *, decode: bool = False) -> redis.Redis:
        return redis.Redis.from_url(self.url(role), socket_timeout=10, decode_responses=decode)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def ops_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    passwords = {role: f"{role}-{secrets.token_hex(12)}" for role in ROLES}
    server = OpsRedis(tmp_path_factory.mktemp("ops-redis"), render_acl(FARM, passwords),
                      passwords)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def admin(ops_redis: OpsRedis) -> Iterator[redis.Redis]:
    client = ops_redis.client("admin", decode=True)
    yield client
    client.close()


def farm_toml(path: Path, url: str, state_dir: Path) -> Path:
    return write_farm(path, farm={"name": FARM, "redis_url": url, "state_dir": state_dir},
                      rollout={**G2_B2, "max_staleness": 10}, engine={"slots_per_replica": 2},
                      timeouts={"shutdown_grace": 2, "lease": 3, "pause_barrier": 20,
                                "leader_lease": 5})




def snapshot(client: redis.Redis) -> dict[str, object]:
    """Every key of the farm and of RQ with its content (as admin, who may SCAN; a
    client that does not decode: results are MessagePack)."""
    out: dict[str, object] = {}
    for key in sorted(client.scan_iter(match="*", count=1000)):
        kind = client.type(key).decode()
        read = {
            "string": client.get,
            "hash": client.hgetall,
            "list": lambda k: client.lrange(k, 0, -1),
            "set": lambda k: sorted(client.smembers(k)),
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
            "stream": client.xrange,
        }[kind]
        out[key.decode()] = (kind, read(key))
    return out


def acl_log(client: redis.Redis) -> list[dict]:
    return [{k: v for k, v in entry.items() if k in ("username", "reason", "object", "context")}
            for entry in client.acl_log()]


# -- a. the server accepts ops/redis.conf and runs hardened ---------------------------


@pytest.mark.e2e
def test_redis_server_runs_on_ops_conf_with_aof_protected_mode_and_no_default_user(
        ops_redis, admin):
    cfg = admin.config_get("*")
    assert cfg["appendonly"] == "yes"
    assert cfg["appendfsync"] == "everysec"
    assert cfg["protected-mode"] == "yes"
    assert cfg["maxmemory-policy"] == "noeviction"
    assert int(cfg["maxmemory"]) > 0  # noeviction only bites with a limit
    assert cfg["aclfile"] == str(ops_redis.aclfile)
    assert cfg["port"] == str(ops_redis.port) and cfg["bind"] == "127.0.0.1"
    assert Path(cfg["dir"]).resolve() == ops_redis.data.resolve()
    assert cfg["enable-debug-command"] == "no" and cfg["enable-module-command"] == "no"
    persistence = admin.info("persistence")
    assert persistence["aof_enabled"] == 1
    admin.set("qr:{probe}:x", "1")
    wait_for(lambda: any((ops_redis.data / "appendonlydir").glob("*.incr.aof")), 10,
             "the AOF under the data dir")

    # The file itself: AOF on, users from the ACL file (no inline users), no renames.
    directives = [line.split() for line in (OPS / "redis.conf").read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
    names = [d[0] for d in directives]
    assert "rename-command" not in names and "user" not in names and "requirepass" not in names
    assert ["appendonly", "yes"] in directives and ["appendfsync", "everysec"] in directives
    assert ["protected-mode", "yes"] in directives
    assert ["maxmemory-policy", "noeviction"] in directives
    assert ["aclfile", "/etc/queue-rollout/users.acl"] in directives

    # Nobody gets in without a user and password: the default user is off.
    anonymous = redis.Redis(host="127.0.0.1", port=ops_redis.port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    users = {line.split()[1]: line for line in admin.acl_list()}
    assert set(users) == {"default", *ROLES}
    default = admin.acl_getuser("default")
    assert "off" in default["flags"] and default["passwords"] == []
    with pytest.raises(redis.AuthenticationError):  # and nobody can log in as it
        redis.Redis(host="127.0.0.1", port=ops_redis.port, username="default",
                    password="", socket_timeout=5).ping()
    for role in ("collector", "worker", "trainer"):
        assert f"~qr:{{{FARM}}}:*" in users[role]
        assert "~*" not in users[role].split() and "+@all" not in users[role].split()
    with pytest.raises(RedisUnavailable) as bad:  # a wrong password, through the package
        connect(ops_redis.url("worker", "not-the-password"))
    assert "not-the-password" not in str(bad.value) and "***" in str(bad.value)


def test_the_template_acl_refuses_to_start_until_its_placeholders_are_filled(tmp_path):
    """An operator who installs users.acl unedited gets no server, not open users."""
    server = OpsRedis(tmp_path, (OPS / "users.acl").read_text(), {})
    port = free_port()
    proc = subprocess.run(server.argv(port), capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "ACL" in proc.stdout + proc.stderr
    assert "password hash must be exactly 64 characters" in proc.stdout + proc.stderr


@pytest.mark.e2e
def test_the_ledger_survives_a_redis_crash_and_aof_replay_under_these_acls(tmp_path):
    """Redis replays its AOF as the *default* user and re-checks ACLs at each EXEC
    (redis/redis#14541, fixed only in later releases): with the default user stripped of
    permissions, every MULTI/EXEC in the AOF, which is how Redis 7 logs each ledger
    script's effects, is dropped on restart without an error and the ledger is lost.
    users.acl keeps the default user *off* (nobody can log in as it) but with every
    permission, so that the replay is whole."""
    passwords = {role: f"{role}-{secrets.token_hex(12)}" for role in ROLES}
    server = OpsRedis(tmp_path / "crash", render_acl(FARM, passwords), passwords)
    server.start()
    try:
        tomls = {role: farm_toml(tmp_path / f"{role}.toml", server.url(role),
                                 tmp_path / f"state-{role}") for role in ROLES}
        trainer = RolloutClient.from_config(tomls["trainer"])
        config = load_config(tomls["collector"])
        collector = Collector(Ledger.from_config(connect(server.url("collector")), config),
                              config, name="crash-collector")
        worker = Ledger.from_config(connect(server.url("worker")), config)
        trainer.submit([{"id": f"g{i}", "prompt": "x", "member_lengths": [3, 3]}
                        for i in range(3)])
        collector.step()  # admits all three, hands their attempts to RQ
        group = collector.ledger.group("g0")
        for member, aid in enumerate(group.attempt_ids):
            assert worker.start(aid, "w-gpu0", "http://replica", "boot", 30).status == "started"
            result = EpisodeResult(member=member, output_ids=[1, 2, 3], logprobs=[0.0] * 3,
                                   version_runs=[(0, 3)], finish_reason="length")
            assert worker.finish(aid, member, encode_result(result),
                                 output_tokens=3).status == "recorded"
        collector.step()  # judges g0
        with server.client("admin") as raw:
            before = snapshot(raw)
        assert before[Keys(FARM).counters][1][b"accepted"] == b"1"
        assert len(before["rq:queue:" + Keys(FARM).rq_queue][1]) == 6  # 3 groups x 2 jobs
        aof = b"".join(p.read_bytes() for p in (server.data / "appendonlydir").glob("*.incr.aof"))
        assert b"MULTI" in aof  # the scripts' effects are there as transactions

        port = server.port
        server.proc.kill()  # a crash: no shutdown, no final save
        server.proc.wait()
        with server.log.open("ab") as log:
            server.proc = subprocess.Popen(server.argv(port), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        assert server.ready(), server.tail()
        with server.client("admin", decode=True) as admin:
            assert acl_log(admin) == []  # the replay was refused nothing
        with server.client("admin") as raw:
            assert snapshot(raw) == before
            assert examine(raw, Keys(FARM), batch_size=2).ok
        again = RolloutClient.from_config(tomls["trainer"])  # the farm carries on
        assert again.ledger.counters()["accepted"] == 1
        assert again.ledger.pop_batch("trainer-0") is None  # 1 group ready of B = 2
    finally:
        server.stop()


# -- b. the farm end to end, each component as its own ACL user ----------------------


@pytest.mark.e2e
def test_the_farm_runs_end_to_end_as_collector_worker_and_trainer_users(
        ops_redis, admin, tmp_path):
    admin.acl_log_reset()
    tomls = {role: farm_toml(tmp_path / f"{role}.toml", ops_redis.url(role),
                             tmp_path / f"state-{role}") for role in ROLES}
    trainer = RolloutClient.from_config(tomls["trainer"], consumer="trainer-0")
    config = load_config(tomls["collector"])
    collector = Collector(Ledger.from_config(connect(ops_redis.url("collector")), config),
                          config, name="ops-collector")
    prompts = [{"id": f"g{i}", "prompt": "x", "member_lengths": [20, 60]} for i in range(4)]
    assert trainer.submit(prompts) == 4

    with ThreadedSimEngine(slots=4, step_ms=0.5) as engine:
        worker_log = (tmp_path / "worker.log").open("w")
        worker = subprocess.Popen(
            [EXE, "worker", "--gpu", "0", "--engine-url", engine.url,
             "-c", str(tomls["worker"])], stdout=subprocess.PIPE, stderr=worker_log, text=True)
        try:
            assert "2 episode slots" in worker.stdout.readline(), (
                tmp_path / "worker.log").read_text()[-3000:]
            ledger = collector.ledger

            def step_until_accepted() -> bool:
                collector.step()
                return ledger.counters().get("accepted", 0) == 4

            wait_for(step_until_accepted, 60, "4 groups run by the worker and accepted")
            c = ledger.counters()
            assert (c["admitted"], c["finished"], c["output_tokens"]) == (4, 8, 4 * 80)

            delivered = []
            for version in (1, 2):
                batch = trainer.get_batch(timeout=30)
                assert len(batch.groups) == 2
                assert all(len(m.output_ids) == (20, 60)[m.member]
                           for g in batch.groups for m in g.members)
                delivered += [g.id for g in batch.groups]
                trainer.ack(batch)
                trainer.set_version(version)
            assert sorted(delivered) == [f"g{i}" for i in range(4)]

            # trainer controls through the live worker (its pause and weight acks)
            trainer.pause()
            assert SGLangClient(engine.url).server_info()["paused"] == "in_place"
            trainer.resume()
            trainer.update_weights(str(tmp_path), 3)  # a folder: the replica loads it
            assert SGLangClient(engine.url).server_info()["weight_version"] == "3"
            status = trainer.status()
            assert (status["workers"]["alive"], status["workers"]["slots"]) == (1, 2)
            assert status["groups"]["consumed"] == 4 and status["version"] == 3
            assert status["redis_replicas"] == 0 and status["redis_primary"].startswith("127.")

            # the collector's other duties: metrics (INFO memory), a full reconciler scan
            metrics = {m.name: m for m in LedgerCollector(ledger, config).collect()}
            assert metrics["queue_rollout_redis_used_memory_bytes"].samples[0].value > 0
            collector.reconciler.tick(scan_jobs=True)

            # the CLI as these users
            for role, args in (("trainer", ["status", "--json"]), ("collector", ["doctor"]),
                               ("admin", ["doctor"])):
                run = subprocess.run([EXE, *args, "-c", str(tomls[role])],
                                     capture_output=True, text=True, timeout=60)
                assert run.returncode == 0, (role, args, run.stdout, run.stderr)
            assert json.loads(subprocess.run(
                [EXE, "status", "--json", "-c", str(tomls["worker"])], capture_output=True,
                text=True, timeout=60).stdout)["groups"]["consumed"] == 4
        finally:
            worker.send_signal(signal.SIGTERM)
            rc = worker.wait(60)
            worker_log.close()
    assert rc == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert admin.hlen(Keys(FARM).workers) == 0  # the worker deregistered as itself
    with ops_redis.client("admin") as raw:
        assert examine(raw, Keys(FARM), batch_size=2).ok
    # Nothing was refused along the way, not even what the package or RQ would swallow
    # (RQ's CLIENT SETNAME, a denied pub/sub subscription, a retried script).
    assert acl_log(admin) == []
    assert "NOPERM" not in (tmp_path / "worker.log").read_text()


# -- ... and every user is refused outside its scope ---------------------------------


def test_each_user_is_refused_outside_its_scope(ops_redis, admin):
    admin.acl_log_reset()
    worker, collector, trainer = (ops_redis.client(r) for r in ("worker", "collector", "trainer"))
    try:
        for client in (worker, collector, trainer):
            assert client.ping()
            for refused in (("SET", "other:key", "1"), ("GET", "qr:{otherfarm}:counters"),
                            ("HSET", "qr:{otherfarm}:counters", "reserved", "0"),
                            ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"),
                            ("CONFIG", "SET", "appendonly", "no"), ("KEYS", "*"),
                            ("SCAN", "0"), ("SAVE",), ("BGREWRITEAOF",),
                            ("ACL", "SETUSER", "intruder", "on", "nopass", "+@all", "~*"),
                            ("CLIENT", "LIST"), ("FUNCTION", "FLUSH"), ("SCRIPT", "FLUSH"),
                            ("SWAPDB", "0", "1"), ("REPLICAOF", "127.0.0.1", "1"),
                            ("PUBLISH", "rq:pubsub:someone", "{}"),
                            ("PUBLISH", "qr:{otherfarm}:controls", "pause")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    client.execute_command(*refused)
        # the ledger of another farm, through the package: its translated error
        for client in (worker, collector, trainer):
            other = Ledger(client, "otherfarm", RolloutConfig())
            with pytest.raises(LedgerError, match="no permissions"):
                other.counters()
            with pytest.raises(LedgerError, match="no permissions"):
                other.submit([("p0", b'{"prompt": "x"}')])
        # the trainer has no business with RQ's keys or channels
        with pytest.raises(redis.exceptions.NoPermissionError):
            trainer.llen("rq:queue:qr-opsfarm-episodes")
        for client in (collector, trainer, worker):
            pubsub = client.pubsub()
            with pytest.raises(redis.exceptions.NoPermissionError):
                pubsub.subscribe("rq:pubsub:someone")
                pubsub.get_message(timeout=5)
            pubsub.close()
        # the trainer announces controls, the worker listens: on the farm's channel only
        controls = Keys(FARM).controls_channel
        assert trainer.publish(controls, "pause") == 0
        for client in (collector, worker):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.publish(controls, "pause")
        pubsub = worker.pubsub()
        pubsub.subscribe(controls)
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"
        with pytest.raises(redis.exceptions.NoPermissionError):
            pubsub.subscribe("elsewhere")
            pubsub.get_message(timeout=5)
        pubsub.close()
    finally:
        for client in (worker, collector, trainer):
            client.close()
    # the refusals are in the ACL log, naming the user: what an operator reads
    users = {entry["username"] for entry in acl_log(admin)}
    assert {"worker", "collector", "trainer"} <= users
    assert admin.config_get("appendonly")["appendonly"] == "yes"  # nothing got through


@pytest.mark.e2e
def test_the_example_sentinel_conf_starts_a_sentinel_that_asks_for_its_password(tmp_path):
    """ops/sentinel.conf, with the addresses, directory and placeholders of this machine,
    starts a Sentinel that watches qr-prod and refuses clients without its password."""
    port = free_port()
    text = (OPS / "sentinel.conf").read_text()
    text = (text.replace("port 26379", f"port {port}")
            .replace("bind 10.0.0.11 127.0.0.1", "bind 127.0.0.1")
            .replace("dir /var/lib/redis-sentinel", f"dir {tmp_path}")
            .replace("SENTINEL_USER_PASSWORD", "user-pw")
            .replace("SENTINEL_PORT_PASSWORD", "port-pw"))
    conf = tmp_path / "sentinel.conf"
    conf.write_text(text)
    proc = subprocess.Popen([redis_server_binary(), str(conf), "--sentinel"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = redis.Redis(port=port, password="port-pw", socket_timeout=1)
        masters = wait_for(lambda: _quietly(client.sentinel_masters), 20, "the Sentinel")
        assert masters["qr-prod"]["port"] == 6379 and masters["qr-prod"]["quorum"] == 2
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, socket_timeout=1).sentinel_masters()
    finally:
        proc.terminate()
        proc.wait(10)


def _quietly(call):
    try:
        return call()
    except redis.RedisError:
        return None
