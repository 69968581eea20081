"""Connecting to Redis, and the boundary where Redis errors become ours.

URLs may carry a password or an ACL user (``redis://user:pw@host:port/0``) and may
use TLS (``rediss://``, verified against ``farm.redis_ca_file`` when set). A Sentinel
URL, ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[?db=N]``
(``rediss+sentinel://`` for TLS to the data nodes), names the Sentinels and the
service: every connection asks them for the current primary, so a client follows a
failover without a restart. The user and password are the data nodes'; Sentinel's own
password is ``farm.sentinel_password``. Every message about a URL shows it with the
password masked.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from queue_rollout.config import Config
from queue_rollout.errors import ConfigError, LedgerError, RedisUnavailable


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***``: the userinfo's password (up to
    the last ``@``, so that a password with an unescaped ``/``, ``#`` or ``@`` is
    hidden whole) and a ``password=`` query parameter. Never raises."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    prefix = ""
    if at:
        user, colon, _ = userinfo.partition(":")
        prefix = f"{user}:***@" if colon else f"{userinfo}@"
    base, q, query = hostpart.partition("?")
    if q:
        params = [p.partition("=")[0] + "=***" if p.partition("=")[0].lower() == "password"
                  else p for p in query.split("&")]
        hostpart = f"{base}?{'&'.join(params)}"
    return f"{scheme}{sep}{prefix}{hostpart}"


def url_file(state_dir: str | Path) -> Path:
    """Where the embedded Redis writes its URL for the other commands."""
    return Path(state_dir) / "redis.url"


def resolve_url(config: Config) -> str:
    """``farm.redis_url``, or the URL an embedded Redis left under ``state_dir``."""
    if config.farm.redis_url:
        return config.farm.redis_url
    path = url_file(config.farm.state_dir)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise RedisUnavailable(
            f"no Redis: farm.redis_url is empty and {path} does not exist "
            "(start `queue-rollout up`, or set farm.redis_url)"
        ) from None


SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Sentinel's own port, when a Sentinel URL names a host without one.
SENTINEL_PORT = 26379


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0] in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelTarget:
    """What a Sentinel URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False


def _host_port(item: str) -> tuple[str, int] | None:
    """``host:port``, ``[v6]:port`` or a bare host (Sentinel's port); None if malformed."""
    if item.startswith("["):
        host, bracket, tail = item[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            return None
        port = tail[1:] if tail else str(SENTINEL_PORT)
    else:
        host, colon, port = item.partition(":")
        port = port if colon else str(SENTINEL_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The Sentinels, service, db and data-node login a Sentinel URL names; a
    ConfigError (the URL masked, no part of it quoted) when it is malformed."""
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"farm.redis_url: bad Sentinel URL {mask_url(url)}: {problem}")

    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    userinfo, at, hostpath = rest.rpartition("@")
    if at and ("/" in userinfo or "?" in userinfo or "#" in userinfo):
        raise bad("percent-encode the user and password (an '@', '/', '?' or '#' breaks "
                  "the URL)")
    hosts, slash, service = hostpath.partition("/")
    sentinels = [_host_port(h) for h in hosts.split(",")] if hosts else []
    if not sentinels:
        raise bad("it names no Sentinel (host:port, comma-separated)")
    if None in sentinels:
        raise bad("each Sentinel must be host:port with a numeric port")
    service = service.rstrip("/")
    if not slash or not service or "/" in service or "#" in service:
        raise bad("it must name the service after the Sentinels: .../<service>")
    db = 0
    for param in filter(None, query.split("&")):
        name, _, value = param.partition("=")
        if name != "db":
            raise bad("the only query parameter it takes is db=N")
        if not value.isdigit():
            raise bad("db must be a number")
        db = int(value)
    user, colon, password = userinfo.partition(":")
    return SentinelTarget(
        sentinels=tuple(s for s in sentinels if s is not None), service=unquote(service),
        db=db, username=unquote(user) or None,
        password=unquote(password) if colon and password else None,
        tls=scheme == "rediss+sentinel",
    )


def _url_problem(url: str) -> str:
    """What is wrong with *url* as a Redis URL ("" if nothing we can see), in words
    that quote no part of it (a bad port or db may be the tail of a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "rediss", "unix", *SENTINEL_SCHEMES):
        return ("it must start with redis://, rediss://, unix://, redis+sentinel:// "
                "or rediss+sentinel://")
    if scheme in SENTINEL_SCHEMES:
        return ""  # parse_sentinel_url says what is wrong
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0] or [len(rest)])
    if rest.count("@") > 1 or "@" in rest[end:]:
        return "percent-encode the user and password (an '@', '/', '?' or '#' breaks the URL)"
    if scheme == "unix":
        return ""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when not a number
    except ValueError:
        return ("the port must be a number (percent-encode the user and password: a ':', "
                "'/', '?' or '#' in them breaks the URL)")
    if not parts.hostname:
        return "it names no host"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return "the database (the path) must be a number"
    return ""


class _SentinelBlockingPool(SentinelConnectionPool, redis.BlockingConnectionPool):  # type: ignore[misc]
    """A Sentinel-managed pool whose threads wait for a free connection, as
    :class:`redis.BlockingConnectionPool` does, instead of failing at the limit."""


#: How long one question to a Sentinel may take (each Sentinel is asked in turn).
SENTINEL_TIMEOUT_S = 2.0


def _sentinel_client(url: str, sentinel_password: str, kwargs: dict[str, object],
                     max_connections: int | None) -> redis.Redis:
    target = parse_sentinel_url(url)
    sentinel_kwargs: dict[str, object] = {"socket_timeout": SENTINEL_TIMEOUT_S,
                                          "socket_connect_timeout": SENTINEL_TIMEOUT_S}
    if sentinel_password:
        sentinel_kwargs["password"] = sentinel_password
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    node_kwargs: dict[str, object] = {**kwargs, "db": target.db, "username": target.username,
                                      "password": target.password}
    if target.tls:
        node_kwargs["ssl"] = True
    if max_connections is None:
        return sentinel.master_for(target.service, **node_kwargs)
    return sentinel.master_for(target.service, connection_pool_class=_SentinelBlockingPool,
                               max_connections=max_connections, timeout=None, **node_kwargs)


def connect(url: str, ca_file: str = "", *, sentinel_password: str = "", check: bool = True,
            max_connections: int | None = None,
            socket_timeout: float | None = None) -> redis.Redis:
    """A client for *url*; with *check*, PING it first (RedisUnavailable if down, or
    if it refuses the login or the TLS handshake; for a Sentinel URL also when no
    Sentinel answers or none knows the service). With *max_connections*, its threads
    share at most that many connections (waiting for a free one). *socket_timeout*
    replaces redis-py's 5 s for a client that blocks longer (BLMOVE). A malformed URL
    or a *ca_file* that is not there is a ConfigError; no message shows the password."""
    problem = _url_problem(url)
    if problem:
        raise ConfigError(f"farm.redis_url: bad Redis URL {mask_url(url)}: {problem}")
    tls = url.startswith(("rediss://", "rediss+sentinel://"))
    kwargs: dict[str, object] = {"health_check_interval": 30}
    if socket_timeout is not None:
        kwargs["socket_timeout"] = socket_timeout
    if tls:  # the certificate must name the host (redis-py < 6: off)
        kwargs["ssl_check_hostname"] = True
    if tls and ca_file:
        if not Path(ca_file).is_file():
            raise ConfigError(f"farm.redis_ca_file: no such file: {ca_file}")
        kwargs["ssl_ca_certs"] = ca_file
    try:
        if is_sentinel_url(url):
            client = _sentinel_client(url, sentinel_password, kwargs, max_connections)
        elif max_connections is None:
            client = redis.Redis.from_url(url, **kwargs)
        else:
            client = redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=None, **kwargs))
    except ValueError:  # its message may quote a piece of the URL: not shown
        raise ConfigError(f"farm.redis_url: bad Redis URL {mask_url(url)}") from None
    if check:
        with translate_errors(url):
            client.ping()
    return client


def connect_config(config: Config, *, check: bool = True, max_connections: int | None = None,
                   socket_timeout: float | None = None) -> redis.Redis:
    """A client of the farm's Redis as *config* names it (URL, CA file, Sentinel's
    password); the keywords as for :func:`connect`."""
    return connect(resolve_url(config), config.farm.redis_ca_file,
                   sentinel_password=config.farm.sentinel_password, check=check,
                   max_connections=max_connections, socket_timeout=socket_timeout)


@contextlib.contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn redis-py's errors into :class:`RedisUnavailable` / :class:`LedgerError`,
    with *url* masked: a refused login and a failed TLS handshake say so."""
    try:
        yield
    except redis.AuthenticationError as exc:
        raise RedisUnavailable(f"Redis at {mask_url(url)} refused the login: {exc} "
                               "(check the user and password in farm.redis_url)") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if isinstance(exc.__context__, ssl.SSLCertVerificationError):
            raise RedisUnavailable(
                f"TLS to Redis at {mask_url(url)} failed: {exc} (the server's certificate "
                "must be signed by the CA in farm.redis_ca_file)") from None
        if isinstance(exc.__context__, ssl.SSLError):
            raise RedisUnavailable(f"TLS to Redis at {mask_url(url)} failed: {exc}") from None
        raise RedisUnavailable(f"Redis unreachable at {mask_url(url)}: {exc}") from None
    except redis.exceptions.InvalidResponse as exc:
        raise RedisUnavailable(f"what answers at {mask_url(url)} does not speak Redis's "
                               f"protocol ({exc}): is farm.redis_url a Redis port?") from None
    except redis.ResponseError as exc:
        raise LedgerError(f"Redis answered an error: {exc}") from None


def client_url(client: redis.Redis) -> str:
    """A printable (masked) description of where *client* connects."""
    pool = client.connection_pool
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    if isinstance(pool, SentinelConnectionPool):
        return f"{scheme}+sentinel://{pool.service_name}"
    kw = pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"{scheme}://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


def primary_address(client: redis.Redis) -> str:
    """``host:port`` of the Redis that takes *client*'s writes now: for a Sentinel
    client the primary the Sentinels name (RedisUnavailable if none does)."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        with translate_errors(client_url(client)):
            host, port = pool.get_master_address()
        return f"{host}:{port}"
    kw = pool.connection_kwargs
    if "path" in kw:
        return str(kw["path"])
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}"
