"""queue-rollout: sample-level refill for LLM RL rollouts across a GPU farm."""

from .client import Batch, RolloutClient
from .config import Config, load_config
from .errors import QueueRolloutError
from .ledger import Ledger

__all__ = ["Batch", "Config", "Ledger", "QueueRolloutError", "RolloutClient", "load_config"]
__version__ = "0.1.0"
