"""``queue-rollout release --consumer ID``: a gone consumer's unacknowledged batch goes
back whole to the head of the ready groups, so that the next ``get_batch`` of any
consumer delivers it (``redelivered``); the old consumer's late ack of it is refused."""

from __future__ import annotations

import argparse

from queue_rollout.config import Config

HELP = ("return a consumer's unacknowledged batch to the ready groups: the next batch "
        "any consumer takes is that one; its late ack is refused")


def configure(p: argparse.ArgumentParser) -> None:
    """The options of ``release``."""
    p.add_argument("--consumer", required=True, metavar="ID",
                   help="the consumer whose unacknowledged batch is released")


def cmd_release(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.ledger.connection import connect_config
    from queue_rollout.ledger.core import Ledger

    ledger = Ledger.from_config(connect_config(config), config)
    batch = ledger.release(args.consumer)
    if batch is None:
        print(f"consumer {args.consumer} holds no batch: nothing released")
        return 0
    print(f"released batch {batch.id} of consumer {args.consumer} (delivered under "
          f"version {batch.version}): {len(batch.groups)} groups back at the head of the "
          f"ready groups: {', '.join(batch.groups)}")
    return 0
