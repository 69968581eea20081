"""Connecting to Redis, and the boundary where Redis errors become ours.

URLs may carry a password or an ACL user (``redis://user:pw@host:port/0``) and may
use TLS (``rediss://``, verified against ``farm.redis_ca_file`` when set). Every
message about a URL shows it with the password masked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

from .config import Config
from .errors import LedgerError, RedisUnavailable


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable redis url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


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


def connect(url: str, ca_file: str = "", *, check: bool = True) -> redis.Redis:
    """A client for *url*; with *check*, PING it first (RedisUnavailable if down)."""
    kwargs: dict[str, object] = {"health_check_interval": 30}
    if url.startswith("rediss://") and ca_file:
        kwargs["ssl_ca_certs"] = ca_file
    try:
        client = redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:
        raise RedisUnavailable(f"bad Redis URL {mask_url(url)}: {exc}") from None
    if check:
        with translate_errors(url):
            client.ping()
    return client


def connect_config(config: Config, *, check: bool = True) -> redis.Redis:
    return connect(resolve_url(config), config.farm.redis_ca_file, check=check)


@contextlib.contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn redis-py's errors into :class:`RedisUnavailable` / :class:`LedgerError`."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(f"Redis unreachable at {mask_url(url)}: {exc}") from None
    except redis.ResponseError as exc:
        raise LedgerError(f"Redis answered an error: {exc}") from None


def client_url(client: redis.Redis) -> str:
    """A printable (masked) description of where *client* connects."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    scheme = "rediss" if client.connection_pool.connection_class.__name__ == "SSLConnection" else "redis"
    return f"{scheme}://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
