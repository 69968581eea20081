"""What a trainer trains on: a batch laid out over each member's token positions.

    view = batch.training_view(client.version(), config.rollout.max_staleness)
    for s in view.samples:   # one per member, groups in order
        s.input_ids    # the prompt's ids, each turn's output, the tool tokens between
        s.loss_mask    # 1 where the policy produced the token, 0 on prompt and tool tokens
        s.logprobs     # the rollout's logprob of each produced token, 0.0 elsewhere
        s.versions     # the policy version of each produced token, -1 elsewhere
        s.stale_mask   # 1 on produced tokens older than the staleness window, else 0
    tensors = view.tensors(pad_id=0)   # padded torch tensors, where torch is installed

The ids are those the replicas were sent and produced: nothing is tokenized again. A
prompt given as text has ids only when the client tokenized it at submit
(``RolloutClient(..., tokenize=...)``); a member whose calls were not one growing
sequence of ids (a text prompt, a workflow that rewrote its context) cannot be laid
out, and the view says which one. A failed member (no output) is a sample of its
prompt alone: nothing to train on, reward None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from queue_rollout.errors import BadInput
from queue_rollout.transcript import layout

if TYPE_CHECKING:
    from queue_rollout.client.rollout import Batch, Group, Member


@dataclass(frozen=True)
class Sample:
    """One member over the positions of its sequence (all lists of one length)."""

    group: str
    member: int
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    stale_mask: list[int]
    reward: float | None
    finish_reason: str
    prompt_len: int
    turn_spans: list[tuple[int, int]]  # [start, end) of each turn's output


@dataclass(frozen=True)
class TrainingBatch:
    samples: list[Sample]
    version: int  # the policy version the stale mask was taken against
    max_staleness: int

    def groups(self) -> list[list[Sample]]:
        """The samples of each group, in order."""
        out: dict[str, list[Sample]] = {}
        for s in self.samples:
            out.setdefault(s.group, []).append(s)
        return list(out.values())

    def masked_share(self) -> float:
        """The share of produced tokens the stale mask removes (nan: none produced)."""
        produced = sum(sum(s.loss_mask) for s in self.samples)
        return sum(sum(s.stale_mask) for s in self.samples) / produced if produced else math.nan

    def tensors(self, pad_id: int = 0) -> dict[str, Any]:
        """Padded torch tensors, batch dimension first, right-padded to the longest
        sample: ``input_ids``, ``attention_mask``, ``loss_mask``, ``logprobs``,
        ``versions`` and ``stale_mask`` of shape (samples, length); ``rewards`` (nan
        where a member has none) and ``group_index`` of shape (samples,). Needs torch."""
        try:
            import torch
        except ImportError:
            raise ImportError("TrainingBatch.tensors needs torch; the lists are "
                              "in .samples") from None
        width = max((len(s.input_ids) for s in self.samples), default=0)

        def pad(rows: Sequence[Sequence[float]], fill: float, dtype: Any) -> Any:
            return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows],
                                dtype=dtype).reshape(len(rows), width)

        index = {g: i for i, g in enumerate(dict.fromkeys(s.group for s in self.samples))}
        return {
            "input_ids": pad([s.input_ids for s in self.samples], pad_id, torch.long),
            "attention_mask": pad([[1] * len(s.input_ids) for s in self.samples], 0,
                                  torch.long),
            "loss_mask": pad([s.loss_mask for s in self.samples], 0, torch.long),
            "logprobs": pad([s.logprobs for s in self.samples], 0.0, torch.float32),
            "versions": pad([s.versions for s in self.samples], -1, torch.long),
            "stale_mask": pad([s.stale_mask for s in self.samples], 0, torch.long),
            "rewards": torch.tensor([math.nan if s.reward is None else s.reward
                                     for s in self.samples], dtype=torch.float32),
            "group_index": torch.tensor([index[s.group] for s in self.samples],
                                        dtype=torch.long),
        }


def training_view(batch: Batch, version: int, max_staleness: int) -> TrainingBatch:
    """*batch* laid out for training; a produced token is stale when ``version - its
    version > max_staleness``. BadInput names a member that cannot be laid out."""
    return TrainingBatch([sample(g, m, version, max_staleness)
                          for g in batch.groups for m in g.members],
                         version, max_staleness)


def sample(group: Group, m: Member, version: int, max_staleness: int) -> Sample:
    where = f"group {group.id!r} member {m.member}"
    prompt = m.prompt_ids if m.prompt_ids is not None else group.prompt.get("input_ids")
    if prompt is None:
        raise BadInput(f"{where}: its prompt was sent as text, so its token ids were never "
                       "recorded; submit token ids, or give RolloutClient a tokenize "
                       "function to submit with")
    if m.output_ids and m.tool_ids is None:
        raise BadInput(f"{where}: its calls were not one growing sequence of token ids "
                       "(a text context, or a workflow that rewrote its context)")
    if len(m.logprobs) != len(m.output_ids):
        raise BadInput(f"{where}: {len(m.logprobs)} logprobs for {len(m.output_ids)} tokens")
    turns = m.turn_lengths if m.turn_lengths or not m.output_ids else [len(m.output_ids)]
    try:
        laid = layout(list(prompt), m.output_ids, turns, m.tool_ids or [])
    except ValueError as exc:
        raise BadInput(f"{where}: {exc}") from None
    produced = iter(zip(m.logprobs, m.versions, strict=True))
    logprobs, versions, stale = [], [], []
    for p in laid.produced:
        lp, v = next(produced) if p else (0.0, -1)
        logprobs.append(lp)
        versions.append(v)
        stale.append(int(p and version - v > max_staleness))
    return Sample(group.id, m.member, laid.input_ids, [int(p) for p in laid.produced],
                  logprobs, versions, stale, m.reward, m.finish_reason,
                  len(prompt), laid.turn_spans)
