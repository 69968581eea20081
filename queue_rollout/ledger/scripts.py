"""Loading the ledger's Lua scripts: one ``.lua`` file per operation.

Each script is the shared ``_lib.lua`` followed by the operation's own file; both are
read once per process and registered with redis-py (EVALSHA, reloaded on NOSCRIPT).
A farm that waits for replicas loads each operation wrapped by ``_receipt.lua`` (one
more key and argument: the call's receipt), so that a change sent again is applied
once. The header of each file (its ``-- KEYS[i] =`` / ``-- ARGV[i] =`` lines) is
parsed so the Python wrapper can check that it passes the number of keys the script
documents.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources

import redis
from redis.commands.core import Script

_KEY_LINE = re.compile(r"^-- KEYS\[(\d+)\] = ", re.MULTILINE)

OPERATIONS = (
    "submit", "admit", "start", "progress", "expire", "finish", "doubt", "retry",
    "judge", "pop_batch", "ack", "release", "set_version", "set_paused", "lead", "move",
    "replicas", "reserve", "settle", "consume",
)


def _lua(name: str) -> str:
    return (resources.files("queue_rollout.ledger") / "lua" / f"{name}.lua").read_text()


@functools.cache
def source(name: str, *, receipts: bool = False) -> str:
    """Full source of script *name*: the shared library, then the operation; with
    *receipts*, the operation as a function that ``_receipt.lua`` calls."""
    if not receipts:
        return _lua("_lib") + "\n" + _lua(name)
    return (_lua("_lib") + "\nlocal function operation()\n" + _lua(name) + "\nend\n"
            + _lua("_receipt"))


@functools.cache
def documented_key_count(name: str) -> int:
    """How many KEYS the script's header documents."""
    return max((int(n) for n in _KEY_LINE.findall(_lua(name))), default=0)


def script_names() -> dict[str, str]:
    """Each operation's script by its SHA1 (what ``EVALSHA`` names it by), with and
    without receipts: SHA1 -> the operation's name."""
    return {hashlib.sha1(source(name, receipts=r).encode()).hexdigest(): name
            for name in OPERATIONS for r in (False, True)}


class Scripts:
    """The registered scripts for one Redis client; with *receipts*, each but the
    *unwrapped* ones takes its call's receipt key after its own keys, and a resent
    flag and the receipt's lifetime after its own arguments."""

    def __init__(self, client: redis.Redis, *, receipts: bool = False,
                 unwrapped: frozenset[str] = frozenset()) -> None:
        self.receipts = receipts
        self._wrapped = {name for name in OPERATIONS if receipts and name not in unwrapped}
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name, receipts=name in self._wrapped))
            for name in OPERATIONS
        }

    def wrapped(self, name: str) -> bool:
        """Whether script *name* takes a receipt."""
        return name in self._wrapped

    def _check(self, name: str, keys: list[str]) -> None:
        expected = documented_key_count(name) + (1 if name in self._wrapped else 0)
        if len(keys) != expected:
            raise AssertionError(f"{name}.lua takes {expected} keys here, got {len(keys)}")

    def call(self, name: str, keys: list[str], args: list[object]) -> list[object]:
        self._check(name, keys)
        reply: list[object] = self._scripts[name](keys=keys, args=args)
        return reply

    def queue(self, pipe: redis.client.Pipeline, name: str, keys: list[str],
              args: list[object]) -> None:
        """Add the call to *pipe* as a bare EVALSHA: a NOSCRIPT answer comes back in
        the pipeline's results (:meth:`load` it and send again)."""
        self._check(name, keys)
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    def load(self, name: str) -> None:
        """Load script *name* into the server (after a NOSCRIPT: a promoted replica
        or a restarted server has none cached)."""
        script = self._scripts[name]
        script.registered_client.script_load(script.script)
