"""Connecting to Redis, and the boundary where Redis errors become ours.

URLs may carry a password or an ACL user (``redis://user:pw@host:port/0``) and may
use TLS (``rediss://``, verified against ``farm.redis_ca_file`` when set). Every
message about a URL shows it with the password masked.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import redis

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


def _url_problem(url: str) -> str:
    """What is wrong with *url* as a Redis URL ("" if nothing we can see), in words
    that quote no part of it (a bad port or db may be the tail of a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "rediss", "unix"):
        return "it must start with redis://, rediss:// or unix://"
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


def connect(url: str, ca_file: str = "", *, check: bool = True,
            max_connections: int | None = None,
            socket_timeout: float | None = None) -> redis.Redis:
    """A client for *url*; with *check*, PING it first (RedisUnavailable if down, or
    if it refuses the login or the TLS handshake). With *max_connections*, its threads
    share at most that many connections (waiting for a free one). *socket_timeout*
    replaces redis-py's 5 s for a client that blocks longer (BLMOVE). A malformed URL
    or a *ca_file* that is not there is a ConfigError; no message shows the password."""
    problem = _url_problem(url)
    if problem:
        raise ConfigError(f"farm.redis_url: bad Redis URL {mask_url(url)}: {problem}")
    kwargs: dict[str, object] = {"health_check_interval": 30}
    if socket_timeout is not None:
        kwargs["socket_timeout"] = socket_timeout
    if url.startswith("rediss://"):  # the certificate must name the host (redis-py < 6: off)
        kwargs["ssl_check_hostname"] = True
    if url.startswith("rediss://") and ca_file:
        if not Path(ca_file).is_file():
            raise ConfigError(f"farm.redis_ca_file: no such file: {ca_file}")
        kwargs["ssl_ca_certs"] = ca_file
    try:
        if max_connections is None:
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


def connect_config(config: Config, *, check: bool = True) -> redis.Redis:
    return connect(resolve_url(config), config.farm.redis_ca_file, check=check)


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
    except redis.ResponseError as exc:
        raise LedgerError(f"Redis answered an error: {exc}") from None


def client_url(client: redis.Redis) -> str:
    """A printable (masked) description of where *client* connects."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    tls = client.connection_pool.connection_class.__name__ == "SSLConnection"
    scheme = "rediss" if tls else "redis"
    return f"{scheme}://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
