"""``queue-rollout trace GROUP``: one group's story, from the capped, expiring history
the ledger keeps (``[history]``): admitted when and under which policy version, each
attempt (worker, replica, start, end, retries and their cause, doubt and how it was
resolved), judged and why, the batch and its consumer, acknowledged when. A group whose
story is not kept (unknown, not admitted yet, or past the cap or the age) is bad input:
the message says which, exit 2."""

from __future__ import annotations

import argparse
import json

from queue_rollout.config import Config

HELP = ("one group's story: admission, each attempt (worker, replica, retries, doubt), "
        "judgement, batch, consumer, ack")


def configure(p: argparse.ArgumentParser) -> None:
    """The arguments of ``trace``."""
    p.add_argument("group", metavar="GROUP", help="the group's id (its prompt's id)")
    p.add_argument("--json", action="store_true", help="print the story as one JSON object")


def cmd_trace(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.ledger.connection import connect_config
    from queue_rollout.ledger.history import read_story, story_json, story_text
    from queue_rollout.ledger.keys import Keys

    client, cell = connect_config(config), ""
    if config.cells:  # the story is kept in the group's cell
        from queue_rollout.ledger import cells

        control, by_name = cells.connect_farm(config)
        record = control.group(args.group)
        cell = (record.cell if record is not None and record.cell in by_name
                else cells.cell_for(args.group, config.cell_weights()))
        client = by_name[cell].client
    story = read_story(client, Keys(config.farm.name), args.group,
                       ttl_s=config.history.ttl_s)
    if args.json:
        print(story_json(story) if not cell else
              json.dumps({**json.loads(story_json(story)), "cell": cell}))
    else:
        print((f"in cell {cell}\n" if cell else "") + story_text(story))
    return 0
