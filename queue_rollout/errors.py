"""One exception tree for queue-rollout.

Every error the package raises on purpose derives from :class:`QueueRolloutError`.
Each class carries its CLI exit code (1 an invariant violation, 2 bad input or config, 3
a timeout, 4 Redis unreachable), so the CLI maps errors to exit codes in one place.
Redis errors are translated at the boundary (:mod:`queue_rollout.ledger.connection`)
into :class:`RedisUnavailable` or :class:`LedgerError`.
"""

from __future__ import annotations

import errno
import os


class QueueRolloutError(Exception):
    """Base class of every error queue-rollout raises on purpose."""

    exit_code = 1


class ConfigError(QueueRolloutError):
    """The configuration file or an option is invalid; the message names the key."""

    exit_code = 2


class SchemaMismatch(ConfigError):
    """The farm's ledger was written in another schema than this release reads: drain
    the farm with the release that runs it first."""


class BadInput(QueueRolloutError):
    """Input data (prompts, arguments) is invalid; nothing was changed."""

    exit_code = 2


class BatchReleased(BadInput):
    """The batch acknowledged was released from its consumer (``release --consumer``,
    or ``timeouts.batch_ack``): the ledger refused the ack, and its groups are
    delivered to another consumer, which trains on them and acknowledges them."""


class FarmBusy(QueueRolloutError):
    """Another live process owns this farm's ``state_dir`` (``up``, ``demo``, ``node``);
    nothing was started or changed."""

    exit_code = 2


class InvariantViolation(QueueRolloutError):
    """The ledger disagrees with itself (see ``queue-rollout doctor``)."""

    exit_code = 1


class BarrierTimeout(QueueRolloutError):
    """A wait (pause barrier, batch, a replica to answer) ran past its deadline."""

    exit_code = 3


class RedisUnavailable(QueueRolloutError):
    """Redis cannot be reached; the message carries the URL without its password."""

    exit_code = 4


class LedgerError(QueueRolloutError):
    """A ledger script failed or answered something it never should."""

    exit_code = 1


class ClockSkewed(QueueRolloutError):
    """This process's clock is further from the Redis server's than
    ``timeouts.clock_skew``: it refuses work (the message names both clocks)."""

    exit_code = 2


class EmbeddedRedisError(QueueRolloutError):
    """The embedded redis-server could not be found or started."""

    exit_code = 4


def bind_failed(key: str, host: str, port: int, exc: OSError) -> ConfigError:
    """The error for a socket that could not be bound to *host*:*port*, which the
    setting *key* names (``metrics.port``, ``--port``): one line naming both, e.g.
    ``metrics.port 9464 is in use: [Errno 98] Address already in use (127.0.0.1:9464)``."""
    what = "is in use" if exc.errno == errno.EADDRINUSE else "cannot be bound"
    why = f"[Errno {exc.errno}] {os.strerror(exc.errno)}" if exc.errno else str(exc)
    hint = ("; stop what holds it or choose another port" if exc.errno == errno.EADDRINUSE
            else "")
    return ConfigError(f"{key} {port} {what}: {why} ({host}:{port}){hint}")
