"""Episode workflows: what one episode does with its replica.

A workflow gets an :class:`EpisodeContext` and calls ``ctx.generate(...)`` one or more
times (a multi-turn workflow may run tool steps between calls); the context adds the
rid, the episode's seed and the pause handling, and records every output token with
its policy version. The workflow returns the reward (or None).

The context keeps the member's transcript: a call without ``input_ids`` or ``text``
sends the context so far (the prompt, then each turn's output and the tool output
given to ``ctx.tool``). A call that sends its own ``input_ids`` extending that context
records the extension as tool output; one that sends anything else rewrites the context,
and the member then has no single token sequence to train on (its result says so).

Built in: ``controlled_length`` (member m produces exactly ``member_lengths[m]`` tokens,
``ignore_eos``; the count is checked), ``controlled_turns`` (member m runs the turns of
``member_turns[m]``: exact generated tokens, a tool wait holding the slot, tool output
appended to the context), ``noop`` (no model call: the control plane alone, for the
benchmark) and ``math`` (reward 1 when the final answer, from the last ``\\boxed{}`` or
else the last number, equals the prompt's ``answer``).
Any other name is a plugin, ``package.module:factory``; ``factory(config)`` returns an
object with ``run(ctx) -> float | None``.

What a workflow needs of a prompt beyond ``id`` and one of ``prompt`` / ``input_ids``
is declared beside it, on the class of a built-in or on a plugin's factory (a function
or a class): ``prompt_fields``, the fields every prompt must carry, and
``check_prompt(prompt, config)``, what is wrong with one prompt (a string; None or True:
nothing; a staticmethod on a class). Both are optional. ``submit`` and
``RolloutClient.submit`` refuse a prompt that fails them (:func:`prompt_needs`), so it
never reaches a worker.
"""

from __future__ import annotations

import math
import re
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from queue_rollout.config import Config, load_reference
from queue_rollout.engines.base import Generation, episode_seed
from queue_rollout.engines.synthetic import token_ids
from queue_rollout.errors import ConfigError
from queue_rollout.results import add_tokens
from queue_rollout.transcript import Transcript
from queue_rollout.turns import ModelCall, Turn, member_turns, steps

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
    #: the member's context, token ids or text (None before the first call)
    transcript: Transcript[Any] | None = None
    rewritten: bool = False  # a call sent a context that does not extend the transcript

    def generate(self, *, input_ids: list[int] | None = None, text: str | None = None,
                 **sampling_overrides: Any) -> Generation:
        """One model call, sending *input_ids* or *text*, else the context so far (at
        first the prompt): the episode's seed (turn-specific after the first), the
        workflow's sampling params; output recorded with its versions."""
        transcript = self._follow(input_ids if input_ids is not None else text)
        sent = transcript.context
        params = {**self.sampling, **self.engine_params, **sampling_overrides,
                  "sampling_seed": self.seed if self.turns == 0 else
                  episode_seed(self.seed, "turn", self.turns)}
        ids, txt = (list(sent), None) if isinstance(sent, list) else (None, sent)
        gen, version_runs = self.generate_call(self.turns, ids, txt, params)
        transcript.output(list(gen.output_ids) if ids is not None else gen.text)
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

    def _follow(self, given: list[int] | str | None) -> Transcript[Any]:
        """The transcript brought up to what the next call sends (its context)."""
        t = self.transcript
        if t is not None and given is None:
            return t
        if given is None:
            given = prompt_context(self.prompt)
        if t is not None and type(given) is type(t.context) and \
                given[:len(t.context)] == t.context:
            if len(given) > len(t.context):  # what ran between the turns
                t.tool(given[len(t.context):])
            return t
        self.rewritten = t is not None
        self.transcript = Transcript(list(given) if isinstance(given, list) else given)
        return self.transcript

    def tool_ids(self) -> list[list[int]] | None:
        """The tool tokens between consecutive turns; None unless every call sent token
        ids extending the one before (a text prompt, or a rewritten context)."""
        t = self.transcript
        if t is None or self.rewritten or not isinstance(t.context, list):
            return None
        return [list(x) for x in t.tools[:-1]]

    def sent_prompt(self) -> list[int] | None:
        """The token ids of the first call's context (None for text)."""
        t = self.transcript
        if t is None or self.rewritten or not isinstance(t.context, list):
            return None
        return list(t.context[:t.prompt_len])

    def tool(self, seconds: float, output: list[int] | str | None = None) -> None:
        """A tool runs for *seconds* between turns: the episode keeps its slot and
        nothing generates. Its *output* (token ids, or text for a text context) joins
        the context the next call sends."""
        if output:
            if self.transcript is None or type(output) is not type(self.transcript.context):
                raise TypeError("tool output must be of the context's kind (ids or text), "
                                "after a call")
            self.transcript.tool(output)
        if seconds > 0:
            self.tool_wait(seconds)
            self.tool_seconds.append(seconds)
            if self.tool_after:
                self.tool_after[-1] += seconds


class Workflow(Protocol):
    def run(self, ctx: EpisodeContext) -> float | None: ...


#: ``check_prompt(prompt, config)``: what is wrong with one prompt for a workflow (a
#: string); None or True when it is fine, False to refuse it without a reason.
PromptCheck = Callable[[dict[str, Any], Config], object]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def prompt_context(prompt: dict[str, Any]) -> list[int] | str:
    """What a prompt's first call sends: its ``input_ids``, else its ``prompt`` text."""
    if "input_ids" in prompt:
        return list(prompt["input_ids"])
    return str(prompt.get("prompt", ""))


class ControlledLength:
    """Member m produces exactly ``member_lengths[m]`` tokens (``ignore_eos``)."""

    prompt_fields = ("member_lengths",)

    @staticmethod
    def check_prompt(prompt: dict[str, Any], config: Config) -> str | None:
        lengths, g = prompt["member_lengths"], config.rollout.group_size
        if not isinstance(lengths, list) or len(lengths) != g:
            return f"`member_lengths` must hold rollout.group_size = {g} ints"
        if not all(_is_int(n) and n > 0 for n in lengths):
            return "`member_lengths` entries must be ints > 0"
        return None

    def run(self, ctx: EpisodeContext) -> float | None:
        lengths = ctx.prompt.get("member_lengths")
        if not isinstance(lengths, list) or ctx.member >= len(lengths):
            raise EpisodeFailed(
                f"prompt {ctx.prompt.get('id')!r} has no member_lengths[{ctx.member}]")
        want = int(lengths[ctx.member])
        gen = ctx.generate(max_new_tokens=want, ignore_eos=True)
        if gen.completion_tokens != want or len(ctx.output_ids) != want:
            raise EpisodeFailed(f"produced {len(ctx.output_ids)} tokens, expected {want}")
        return None


#: Filler for a tool's output in a text prompt: 4 bytes, one simulated token.
TOOL_TEXT = " ok."


class ControlledTurns:
    """Member m runs the turns of ``member_turns[m]`` (see :func:`member_spec`), step by
    step as :func:`queue_rollout.turns.steps` lays them out (the virtual farm's episodes
    are the same steps): each generates exactly ``gen`` tokens (``ignore_eos``) from the
    whole context so far, then ``tool_tokens`` of tool output join the context and the
    tool holds the slot ``tool_s`` seconds.
    A member marked ``harness_error`` runs its turns and finishes with reward 0 and
    finish reason ``harness_error``; otherwise its ``reward`` (default none)."""

    prompt_fields = ("member_turns",)

    @staticmethod
    def check_prompt(prompt: dict[str, Any], config: Config) -> str | None:
        return check_member_turns(prompt["member_turns"], group_size=config.rollout.group_size,
                                  max_turns=config.limits.max_turns)

    def run(self, ctx: EpisodeContext) -> float | None:
        turns, harness_error, reward = member_spec(ctx.prompt, ctx.member)
        ids = "input_ids" in ctx.prompt
        for step in steps(turns):  # the virtual farm schedules the same steps
            if isinstance(step, ModelCall):
                gen = ctx.generate(max_new_tokens=step.tokens, ignore_eos=True)
                if len(gen.output_ids) != step.tokens:
                    raise EpisodeFailed(f"turn {ctx.turns}: produced {len(gen.output_ids)} "
                                        f"tokens, expected {step.tokens}")
            else:
                ctx.tool(step.seconds, tool_output(ctx.seed, ctx.turns, step.tokens) if ids
                         else TOOL_TEXT * step.tokens)
        if harness_error:
            ctx.finish_reason = "harness_error"
            return 0.0
        return reward


_TURN_KEYS = frozenset({"gen", "tool_s", "tool_tokens"})
_MEMBER_KEYS = frozenset({"turns", "harness_error", "reward"})


def check_member_turns(value: Any, *, group_size: int, max_turns: int) -> str | None:
    """What is wrong with a ``member_turns`` field, or None. It holds *group_size*
    members; a member is a list of 1 to *max_turns* turns, or an object ``{"turns":
    [...], "harness_error": bool, "reward": number}`` (the last two optional); a turn
    is ``{"gen": int >= 0, "tool_s": seconds >= 0, "tool_tokens": int >= 0}`` (the last
    two optional, default 0)."""
    if not isinstance(value, list) or len(value) != group_size:
        return f"`member_turns` must hold rollout.group_size = {group_size} members"
    for m, member in enumerate(value):
        where = f"`member_turns[{m}]`"
        turns = member
        if isinstance(member, dict):
            unknown = sorted(set(member) - _MEMBER_KEYS)
            if unknown:
                return f"{where}: unknown key {unknown[0]!r} (turns, harness_error, reward)"
            turns = member.get("turns")
            if not isinstance(member.get("harness_error", False), bool):
                return f"{where}: `harness_error` must be true or false"
            reward = member.get("reward")
            if reward is not None and not (_is_number(reward) and math.isfinite(reward)):
                return f"{where}: `reward` must be a finite number"
        if not isinstance(turns, list) or not turns:
            return f"{where} must be a non-empty list of turns (or an object with `turns`)"
        if len(turns) > max_turns:
            return f"{where} has {len(turns)} turns, over limits.max_turns = {max_turns}"
        for t, turn in enumerate(turns):
            if not isinstance(turn, dict):
                return f"{where} turn {t}: a turn must be an object"
            unknown = sorted(set(turn) - _TURN_KEYS)
            if unknown:
                return f"{where} turn {t}: unknown key {unknown[0]!r} (gen, tool_s, tool_tokens)"
            if not (_is_int(turn.get("gen")) and turn["gen"] >= 0):
                return f"{where} turn {t}: `gen` must be an int >= 0"
            tool_s = turn.get("tool_s", 0)
            if not (_is_number(tool_s) and math.isfinite(tool_s) and tool_s >= 0):
                return f"{where} turn {t}: `tool_s` must be a finite number of seconds >= 0"
            if not (_is_int(turn.get("tool_tokens", 0)) and turn.get("tool_tokens", 0) >= 0):
                return f"{where} turn {t}: `tool_tokens` must be an int >= 0"
    return None


def member_spec(prompt: dict[str, Any], member: int
                ) -> tuple[list[Turn], bool, float | None]:
    """Member *member*'s (turns, harness_error, reward) from ``member_turns``: an entry
    is a list of turns, or ``{"turns": [...], "harness_error": bool, "reward": x}``."""
    entries = prompt.get("member_turns")
    if not isinstance(entries, list) or member >= len(entries):
        raise EpisodeFailed(f"prompt {prompt.get('id')!r} has no member_turns[{member}]")
    entry = entries[member]
    if isinstance(entry, list):
        return member_turns(entry), False, None
    reward = entry.get("reward")
    return member_turns(entry), bool(entry.get("harness_error", False)), (
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

    prompt_fields = ("answer",)

    @staticmethod
    def check_prompt(prompt: dict[str, Any], config: Config) -> str | None:
        if not (isinstance(prompt["answer"], str) or _is_number(prompt["answer"])):
            return "`answer` must be a string or a number"
        return None

    def run(self, ctx: EpisodeContext) -> float | None:
        ctx.generate()
        return 1.0 if answers_match(extract_answer("".join(ctx.texts)),
                                    ctx.prompt.get("answer")) else 0.0


class Generate:
    """One generation with ``workflow.sampling``; no reward: the trainer scores it (TRL's
    reward functions, AReaL's)."""

    def run(self, ctx: EpisodeContext) -> float | None:
        ctx.generate()
        return None


class NoOp:
    """Calls no replica and returns no reward: the farm's control plane alone (bench)."""

    def run(self, ctx: EpisodeContext) -> float | None:
        return None


BUILT_IN: dict[str, Callable[[], Workflow]] = {
    "controlled_length": ControlledLength,
    "controlled_turns": ControlledTurns,
    "generate": Generate,
    "math": Math,
    "noop": NoOp,
}


def _factory(config: Config) -> Callable[..., object]:
    """The built-in's class, or the plugin's factory ``workflow.name`` names."""
    name = config.workflow.name
    if name in BUILT_IN:
        return BUILT_IN[name]
    if ":" not in name:
        raise ConfigError(f"workflow.name: {name!r} is neither a built-in "
                          f"({', '.join(BUILT_IN)}) nor package.module:factory")
    return typing.cast(Callable[..., object], load_reference(name, "workflow.name"))


def load_workflow(config: Config) -> Workflow:
    """The workflow ``workflow.name`` names: a built-in, or ``package.module:factory``."""
    name = config.workflow.name
    prompt_needs(config)  # a malformed declaration is refused here as at submit
    if name in BUILT_IN:
        return BUILT_IN[name]()
    workflow = _factory(config)(config)
    if not callable(getattr(workflow, "run", None)):
        raise ConfigError(f"workflow.name: {name!r} returned an object without run(ctx)")
    return typing.cast(Workflow, workflow)


@dataclass(frozen=True)
class PromptNeeds:
    """What the farm's workflow needs of a prompt beyond the basics: the fields every
    prompt must carry, and the workflow's own check (None: none)."""

    workflow: str
    config: Config = field(repr=False)
    fields: tuple[str, ...] = ()
    check: PromptCheck | None = field(default=None, repr=False)

    def problem(self, prompt: dict[str, Any]) -> str | None:
        """What is wrong with *prompt* for this workflow, or None."""
        missing = [f for f in self.fields if f not in prompt]
        if missing:
            return (f"{_names(missing)} missing: workflow {self.workflow!r} needs "
                    f"{'it' if len(missing) == 1 else 'them'} in every prompt")
        if self.check is None:
            return None
        try:
            problem = self.check(prompt, self.config)
        except Exception as exc:  # a plugin's bug refuses the prompt, with what it raised
            return (f"workflow {self.workflow!r}: check_prompt raised "
                    f"{type(exc).__name__}: {exc}")
        if problem is None or problem is True:
            return None
        if isinstance(problem, str) and problem:
            return problem
        return f"refused by workflow {self.workflow!r}'s check_prompt"


def _names(fields: Sequence[str]) -> str:
    names = [f"`{f}`" for f in fields]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def prompt_needs(config: Config) -> PromptNeeds:
    """What ``workflow.name``'s workflow declares it needs of a prompt: ``prompt_fields``
    and ``check_prompt`` on the built-in's class or the plugin's factory (both optional).
    Nothing is built or started: a plugin's module is imported, as loading the config
    already does. ConfigError when a declaration is malformed."""
    name = config.workflow.name
    factory = _factory(config)
    fields = getattr(factory, "prompt_fields", ())
    if fields is None:
        fields = ()
    if isinstance(fields, (str, bytes)) or not isinstance(fields, (list, tuple)) or not all(
            isinstance(f, str) and f for f in fields):
        raise ConfigError(f"workflow.name: {name!r}: prompt_fields must be a list of field "
                          f"names, got {fields!r}")
    check = getattr(factory, "check_prompt", None)
    if check is not None and not callable(check):
        raise ConfigError(f"workflow.name: {name!r}: check_prompt must be a function "
                          "(prompt, config) -> str | None")
    return PromptNeeds(name, config, tuple(fields), check)
