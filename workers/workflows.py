"""Episode workflows: what one episode does with its replica.

A workflow gets an :class:`EpisodeContext` and calls ``ctx.generate(...)`` one or more
times (a multi-turn workflow may run tool steps between calls); the context adds the
rid, the episode's seed and the pause handling, and records every output token with
its policy version. The workflow returns the reward (or None).

Built in: ``controlled_length`` (member m produces exactly ``member_lengths[m]`` tokens,
``ignore_eos``; the count is checked), ``controlled_turns`` (member m runs the turns of
``member_turns[m]``: exact generated tokens, a tool wait holding the slot, tool output
appended to the context), ``noop`` (no model call: the control plane alone, for the
benchmark) and ``math`` (reward 1 when the final answer, from the last ``\\boxed{}`` or
else the last number, equals the prompt's ``answer``).
Any other name is a plugin, ``package.module:factory``; ``factory(config)`` returns an
object with ``run(ctx) -> float | None``.
"""

from __future__ import annotations

import re
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from queue_rollout.config import Config, load_reference
from queue_rollout.engines.sglang import Generation, episode_seed
from queue_rollout.engines.sim_model import token_ids
from queue_rollout.errors import ConfigError
from queue_rollout.results import add_tokens

#: One model call as the worker makes it: (turn, input ids, text, sampling params) ->
#: the generation and the policy versions of its tokens as (version, count) runs.
GenerateCall = Callable[[int, list[int] | None, str | None, dict[str, Any]],
                        tuple[Generation, list[tuple[int, int]]]]


class EpisodeFailed(Exception):
    """The episode cannot produce a valid result (its output broke the workflow's rule)."""


@dataclass
class EpisodeContext:
    prompt: dict[str, Any]
    member: int
    seed: int
    sampling: dict[str, Any]
    generate_call: GenerateCall = field(repr=False)
    #: sampling params the worker's engine adds to every request (the simulated
    #: replica's answer hints; nothing for SGLang)
    engine_params: dict[str, Any] = field(default_factory=dict)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_runs: list[tuple[int, int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reason: str = ""
    turns: int = 0
    prompt_tokens: int = 0  # context tokens sent, over every call (the replica's count)
    cached_tokens: int = 0  # of those, found in the replica's prefix cache
    turn_lengths: list[int] = field(default_factory=list)  # output tokens of each call
    call_contexts: list[int] = field(default_factory=list)  # context tokens of each call
    tool_seconds: list[float] = field(default_factory=list)  # each tool wait
    tool_after: list[float] = field(default_factory=list)  # tool seconds after each call
    #: how a tool wait holds the slot (the worker's: recorded in the ledger, stoppable)
    tool_wait: Callable[[float], None] = field(default=time.sleep, repr=False)

    def generate(self, *, input_ids: list[int] | None = None, text: str | None = None,
                 **sampling_overrides: Any) -> Generation:
        """One model call: the episode's seed (turn-specific after the first), the
        workflow's sampling params; output recorded with its versions."""
        params = {**self.sampling, **self.engine_params, **sampling_overrides,
                  "sampling_seed": self.seed if self.turns == 0 else
                  episode_seed(self.seed, "turn", self.turns)}
        gen, version_runs = self.generate_call(self.turns, input_ids, text, params)
        self.turns += 1
        self.output_ids += gen.output_ids
        self.logprobs += gen.logprobs
        for version, count in version_runs:
            add_tokens(self.version_runs, version, count)
        self.texts.append(gen.text)
        self.finish_reason = str(gen.finish_reason.get("type", ""))
        self.prompt_tokens += gen.prompt_tokens or 0
        self.cached_tokens += gen.cached_tokens
        self.turn_lengths.append(len(gen.output_ids))
        self.call_contexts.append(gen.prompt_tokens or 0)
        self.tool_after.append(0.0)
        return gen

    def tool(self, seconds: float) -> None:
        """A tool runs for *seconds* between turns: the episode keeps its slot and
        nothing generates."""
        if seconds > 0:
            self.tool_wait(seconds)
            self.tool_seconds.append(seconds)
            if self.tool_after:
                self.tool_after[-1] += seconds


class Workflow(Protocol):
    def run(self, ctx: EpisodeContext) -> float | None: ...


def prompt_input(prompt: dict[str, Any]) -> dict[str, Any]:
    if "input_ids" in prompt:
        return {"input_ids": prompt["input_ids"]}
    return {"text": prompt["prompt"]}


class ControlledLength:
    """Member m produces exactly ``member_lengths[m]`` tokens (``ignore_eos``)."""

    def run(self, ctx: EpisodeContext) -> float | None:
        lengths = ctx.prompt.get("member_lengths")
        if not isinstance(lengths, list) or ctx.member >= len(lengths):
            raise EpisodeFailed(
                f"prompt {ctx.prompt.get('id')!r} has no member_lengths[{ctx.member}]")
        want = int(lengths[ctx.member])
        gen = ctx.generate(**prompt_input(ctx.prompt), max_new_tokens=want, ignore_eos=True)
        if gen.completion_tokens != want or len(ctx.output_ids) != want:
            raise EpisodeFailed(f"produced {len(ctx.output_ids)} tokens, expected {want}")
        return None


#: Filler for a tool's output in a text prompt: 4 bytes, one simulated token.
TOOL_TEXT = " ok."


class ControlledTurns:
    """Member m runs the turns of ``member_turns[m]`` (see :func:`member_spec`): each
    generates exactly ``gen`` tokens (``ignore_eos``) from the whole context so far,
    then holds the slot ``tool_s`` seconds and appends ``tool_tokens`` of tool output.
    A member marked ``harness_error`` runs its turns and finishes with reward 0 and
    finish reason ``harness_error``; otherwise its ``reward`` (default none)."""

    def run(self, ctx: EpisodeContext) -> float | None:
        turns, harness_error, reward = member_spec(ctx.prompt, ctx.member)
        ids = list(ctx.prompt["input_ids"]) if "input_ids" in ctx.prompt else None
        text = None if ids is not None else str(ctx.prompt.get("prompt", ""))
        for turn in turns:
            want = int(turn["gen"])
            gen = (ctx.generate(input_ids=ids, max_new_tokens=want, ignore_eos=True)
                   if ids is not None else
                   ctx.generate(text=text, max_new_tokens=want, ignore_eos=True))
            if len(gen.output_ids) != want:
                raise EpisodeFailed(f"turn {ctx.turns}: produced {len(gen.output_ids)} "
                                    f"tokens, expected {want}")
            ctx.tool(float(turn.get("tool_s", 0)))
            tool_tokens = int(turn.get("tool_tokens", 0))
            if ids is not None:
                ids += gen.output_ids + tool_output(ctx.seed, ctx.turns, tool_tokens)
            else:
                text = (text or "") + gen.text + TOOL_TEXT * tool_tokens
        if harness_error:
            ctx.finish_reason = "harness_error"
            return 0.0
        return reward


def member_spec(prompt: dict[str, Any], member: int
                ) -> tuple[list[dict[str, Any]], bool, float | None]:
    """Member *member*'s (turns, harness_error, reward) from ``member_turns``: an entry
    is a list of turns, or ``{"turns": [...], "harness_error": bool, "reward": x}``."""
    entries = prompt.get("member_turns")
    if not isinstance(entries, list) or member >= len(entries):
        raise EpisodeFailed(f"prompt {prompt.get('id')!r} has no member_turns[{member}]")
    entry = entries[member]
    if isinstance(entry, list):
        return entry, False, None
    reward = entry.get("reward")
    return entry["turns"], bool(entry.get("harness_error", False)), (
        None if reward is None else float(reward))


def tool_output(seed: int, turn: int, n: int) -> list[int]:
    """*n* token ids of a tool's output after *turn* (deterministic, like the rest)."""
    return token_ids(episode_seed(seed, "tool", turn), 0, n)


_BOXED = re.compile(r"\\boxed\{")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces allowed), else the last
    number in the text, else None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if starts:
        i, depth = starts[-1], 1
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def answers_match(got: str | None, want: object) -> bool:
    if got is None:
        return False
    want_s = str(want).strip()
    if got == want_s:
        return True
    try:
        return float(got) == float(want_s)
    except ValueError:
        return False


class Math:
    """Reward 1.0 when the final answer equals the prompt's ``answer``, else 0.0."""

    def run(self, ctx: EpisodeContext) -> float | None:
        ctx.generate(**prompt_input(ctx.prompt))
        return 1.0 if answers_match(extract_answer("".join(ctx.texts)),
                                    ctx.prompt.get("answer")) else 0.0


class NoOp:
    """Calls no replica and returns no reward: the farm's control plane alone (bench)."""

    def run(self, ctx: EpisodeContext) -> float | None:
        return None


BUILT_IN: dict[str, Callable[[Config], Workflow]] = {
    "controlled_length": lambda config: ControlledLength(),
    "controlled_turns": lambda config: ControlledTurns(),
    "math": lambda config: Math(),
    "noop": lambda config: NoOp(),
}


def load_workflow(config: Config) -> Workflow:
    """The workflow ``workflow.name`` names: a built-in, or ``package.module:factory``."""
    name = config.workflow.name
    if name in BUILT_IN:
        return BUILT_IN[name](config)
    if ":" not in name:
        raise ConfigError(f"workflow.name: {name!r} is neither a built-in "
                          f"({', '.join(BUILT_IN)}) nor package.module:factory")
    factory = typing.cast(Callable[[Config], object], load_reference(name, "workflow.name"))
    workflow = factory(config)
    if not callable(getattr(workflow, "run", None)):
        raise ConfigError(f"workflow.name: {name!r} returned an object without run(ctx)")
    return typing.cast(Workflow, workflow)
