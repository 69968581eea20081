"""queue-rollout: sample-level refill for LLM RL rollouts across a GPU farm.

``from queue_rollout import RolloutClient`` is the trainer's entry point. It is loaded
on first use, so that importing a light part of the package (the engines, the
workflows, the config) does not import redis-py, RQ and the ledger with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queue_rollout.config import Config, load_config
from queue_rollout.errors import (
    BadInput,
    BarrierTimeout,
    ConfigError,
    FarmBusy,
    InvariantViolation,
    LedgerError,
    QueueRolloutError,
    RedisUnavailable,
)

if TYPE_CHECKING:
    from queue_rollout.client.rollout import Batch, RolloutClient
    from queue_rollout.ledger.core import Ledger

__all__ = ["BadInput", "BarrierTimeout", "Batch", "Config", "ConfigError", "FarmBusy",
           "InvariantViolation", "Ledger", "LedgerError", "QueueRolloutError",
           "RedisUnavailable", "RolloutClient", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """The three names above that need redis-py, imported when first asked for."""
    if name in ("Batch", "RolloutClient"):
        from queue_rollout.client import rollout

        return getattr(rollout, name)
    if name == "Ledger":
        from queue_rollout.ledger.core import Ledger

        return Ledger
    raise AttributeError(f"module 'queue_rollout' has no attribute {name!r}")
