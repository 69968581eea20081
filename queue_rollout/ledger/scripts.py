"""Loading the ledger's Lua scripts: one ``.lua`` file per operation.

Each script is the shared ``_lib.lua`` followed by the operation's own file; both are
read once per process and registered with redis-py (EVALSHA, reloaded on NOSCRIPT).
The header of each file (its ``-- KEYS[i] =`` / ``-- ARGV[i] =`` lines) is parsed so
the Python wrapper can check that it passes the number of keys the script documents.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

import redis
from redis.commands.core import Script

_KEY_LINE = re.compile(r"^-- KEYS\[(\d+)\] = ", re.MULTILINE)

OPERATIONS = (
    "submit", "admit", "start", "progress", "finish", "doubt", "retry",
    "judge", "pop_batch", "ack", "set_version", "set_paused", "lead",
)


@functools.cache
def source(name: str) -> str:
    """Full source of script *name*: the shared library, then the operation."""
    lua = resources.files("queue_rollout.ledger") / "lua"
    return (lua / "_lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


@functools.cache
def documented_key_count(name: str) -> int:
    """How many KEYS the script's header documents."""
    own = (resources.files("queue_rollout.ledger") / "lua" / f"{name}.lua").read_text()
    return max((int(n) for n in _KEY_LINE.findall(own)), default=0)


class Scripts:
    """The registered scripts for one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in OPERATIONS
        }

    def call(self, name: str, keys: list[str], args: list[object]) -> list[object]:
        if len(keys) != documented_key_count(name):
            raise AssertionError(
                f"{name}.lua documents {documented_key_count(name)} keys, got {len(keys)}"
            )
        reply: list[object] = self._scripts[name](keys=keys, args=args)
        return reply
