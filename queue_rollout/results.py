"""An episode's result as it travels from worker to trainer (msgspec, never pickle).

The worker encodes it with msgspec's MessagePack into the ledger's results hash; the
trainer decodes it with a size cap. Per-token policy versions are stored as runs,
``[(version, count), ...]`` in token order (versions >= 0, counts > 0, covering the
tokens exactly); a result of any other shape is refused as BadInput.
"""

from __future__ import annotations

import msgspec

from queue_rollout.config import NonNegInt, PosInt
from queue_rollout.errors import BadInput


class EpisodeResult(msgspec.Struct, forbid_unknown_fields=True):
    member: NonNegInt
    output_ids: list[int]
    logprobs: list[float]
    version_runs: list[tuple[NonNegInt, PosInt]]  # (policy version, tokens > 0)
    finish_reason: str
    reward: float | None = None
    text: str = ""
    turns: NonNegInt = 1
    error: str = ""
    prompt_tokens: NonNegInt = 0  # context tokens the replica was sent, over every call
    cached_tokens: NonNegInt = 0  # of those, found in its prefix cache (not computed)
    turn_lengths: list[NonNegInt] = msgspec.field(default_factory=list)  # tokens per call
    #: the tool tokens between consecutive turns; None when the member's calls were not
    #: one growing sequence of token ids (a text prompt, a rewritten context)
    tool_ids: list[list[int]] | None = None
    #: the ids the first call sent, where they are not the group's prompt ``input_ids``
    prompt_ids: list[int] | None = None

    def versions(self) -> list[int]:
        """The policy version of each output token."""
        return [v for v, n in self.version_runs for _ in range(n)]


def add_tokens(runs: list[tuple[int, int]], version: int, count: int) -> None:
    """Append *count* tokens of *version* to run-length *runs*."""
    if count <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1] = (version, runs[-1][1] + count)
    else:
        runs.append((version, count))


_encoder = msgspec.msgpack.Encoder()


def encode_result(result: EpisodeResult) -> bytes:
    return _encoder.encode(result)


def decode_result(raw: bytes, max_bytes: int) -> EpisodeResult:
    """Decode a stored result; refuses one over *max_bytes* or of the wrong shape."""
    if len(raw) > max_bytes:
        raise BadInput(f"result of {len(raw)} bytes exceeds limits.max_result_bytes = {max_bytes}")
    try:
        result = msgspec.msgpack.decode(raw, type=EpisodeResult)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadInput(f"malformed episode result: {exc}") from None
    if sum(n for _, n in result.version_runs) != len(result.output_ids):
        raise BadInput("malformed episode result: version runs do not cover the tokens")
    return result
