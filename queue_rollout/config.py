"""Configuration: msgspec structs for the farm's TOML file.

Unknown keys, wrong types (booleans, floats or strings where ints belong) and values
out of range are refused with a :class:`~queue_rollout.errors.ConfigError` whose
message names the key, e.g. ``rollout.group_size: Expected `int` >= 1``.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from queue_rollout.errors import ConfigError

PosInt = Annotated[int, msgspec.Meta(gt=0)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(gt=0, le=65535)]
#: A group is admitted in one script step that creates its G attempts: keep G sane.
GroupSize = Annotated[int, msgspec.Meta(gt=0, le=1024)]
FarmName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
PluginRef = Annotated[str, msgspec.Meta(pattern=r"^$|^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]


#: ``rollout.placement``: any worker takes any attempt, or a group goes to one replica.
Placement = Literal["any", "group"]
#: How a pause stops generation on a replica (SGLang's ``/pause_generation`` modes).
PauseMode = Literal["abort", "in_place", "retract"]

#: The workflows built into the workers (queue_rollout.workers.workflows); any other
#: ``workflow.name`` is a plugin, ``package.module:factory``.
BUILT_IN_WORKFLOWS = ("controlled_length", "controlled_turns", "generate", "math", "noop")


def load_reference(ref: str, key: str) -> object:
    """The callable ``package.module:name`` refers to; ConfigError naming *key* when it
    cannot be imported or is not callable. Plugins (workflow factories, acceptance
    rules) are loaded through here when a config is loaded, and again where they run."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{key}: {ref!r} is not package.module:name")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # ImportError, AttributeError, or the module's own error
        raise ConfigError(f"{key}: cannot load {ref!r}: {type(exc).__name__}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"{key}: {ref!r} is not callable")
    return target


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class FarmConfig(_Section):
    #: The farm's name; every Redis key is `qr:{name}:...`.
    name: FarmName = "demo"
    #: Redis URL (`redis://`, `rediss://`, user and password allowed), or Sentinel's
    #: `redis+sentinel://[user:pw@]host:port[,host:port...]/service`; empty: the embedded
    #: redis-server of `up`/`demo`, found through `state_dir`.
    redis_url: str = ""
    #: Local folder for the embedded Redis, `redis.url`, node logs and boot ids.
    state_dir: str = ".queue-rollout"
    #: CA certificate file for `rediss://` URLs.
    redis_ca_file: str = ""
    #: The Sentinels' own password (`requirepass` on their port), for a `redis+sentinel://`
    #: URL; the URL's password is the data nodes'.
    sentinel_password: str = ""
    #: N: after every ledger change, wait until N replicas hold it (`WAIT`) before acting on
    #: it; 0: do not wait (a failover may lose the last writes).
    redis_wait_replicas: NonNegInt = 0


class RolloutConfig(_Section):
    #: G: episodes per prompt group.
    group_size: GroupSize = 8
    #: B: groups per trainer batch.
    batch_size: PosInt = 16
    #: Group admission: groups in flight at once (capacity = this x G slots).
    max_concurrent_rollouts: PosInt = 16
    #: Set it to opt into sample-level refill: capacity in episode slots, or "auto" for the
    #: live workers' slots. Unset: group admission.
    max_concurrent_samples: PosInt | Literal["auto"] | None = None
    #: Staleness budget: accepted and in-flight groups stay within (max_staleness + 1) x B
    #: of the groups the trainer had consumed when it last set the version.
    max_staleness: NonNegInt = 2
    #: Attempts per episode before it fails (lost attempts count).
    max_attempts: PosInt = 3
    #: "group": a group's attempts go to one replica with G free slots (else as few replicas
    #: as possible), so its prompt is computed there once per prefill batch; "any": any
    #: worker takes any attempt.
    placement: Placement = "any"
    #: Placement: seconds an attempt placed on a replica may wait there before it moves to
    #: the shared queue (it moves at once when the replica's worker is gone).
    placement_wait_s: NonNegFloat = 10.0

    @property
    def mode(self) -> Literal["group", "sample"]:
        """``sample`` when sample-level refill is opted into, else ``group``."""
        return "group" if self.max_concurrent_samples is None else "sample"

    def capacity_slots(self, live_worker_slots: int | None = None) -> int:
        """Capacity in episode slots; group mode counts G slots per group.

        ``"auto"`` needs the sum of live workers' slots.
        """
        if self.max_concurrent_samples is None:
            return self.max_concurrent_rollouts * self.group_size
        if self.max_concurrent_samples == "auto":
            if live_worker_slots is None:
                raise ConfigError(
                    'rollout.max_concurrent_samples: "auto" needs the live workers\' slots'
                )
            return live_worker_slots
        return self.max_concurrent_samples


class TimeoutsConfig(_Section):
    #: Seconds a running attempt's lease lasts; renewed every lease/3.
    lease: PosInt = 30
    #: Seconds an attempt may stay doubtful before it is declared lost and retried.
    doubt: PosInt = 1800
    #: Seconds one `/generate` call may take.
    request: PosInt = 3600
    #: Seconds `pause()` waits for every live worker to confirm.
    pause_barrier: PosInt = 60
    #: Seconds of collector leadership; a standby takes over after it.
    leader_lease: PosInt = 10
    #: SIGTERM: seconds running episodes may still finish.
    shutdown_grace: PosInt = 30
    #: Seconds one `WAIT` for `farm.redis_wait_replicas` may take before the change is sent
    #: again.
    redis_wait: PosFloat = 1.0
    #: Seconds a delivered batch may stay unacknowledged; then the collector releases it:
    #: its groups go to the next consumer that takes a batch, and a late ack of it is
    #: refused. 0: never.
    batch_ack: NonNegInt = 0
    #: Seconds a process's clock may differ from the Redis server's (checked when it
    #: registers and at every heartbeat; beyond it, the process refuses work). Unset:
    #: lease / 3, the most the lease arithmetic tolerates (two processes then differ by
    #: at most 2 * lease / 3, and a lease renewed every lease / 3 still never expires
    #: early). At most lease / 3.
    clock_skew: NonNegFloat | None = None

    @property
    def skew_tolerance(self) -> float:
        """``clock_skew``, or lease / 3 when it is unset."""
        return self.lease / 3 if self.clock_skew is None else self.clock_skew


class AcceptanceConfig(_Section):
    #: Reject groups whose members all got the same reward.
    reject_zero_variance: bool = False
    #: Failed members a group may have and still be accepted.
    max_failed_members: NonNegInt = 0
    #: `package.module:function(group)`: True, or a reason string to reject.
    plugin: PluginRef = ""


class SamplingConfig(_Section, omit_defaults=True):
    """SGLang ``sampling_params`` keys only: a real server refuses unknown ones."""

    #: SGLang sampling temperature.
    temperature: NonNegFloat = 1.0
    #: SGLang nucleus sampling.
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    #: Generation budget per call.
    max_new_tokens: PosInt = 1024
    #: SGLang top-k.
    top_k: int | None = None
    #: SGLang min-p.
    min_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    #: SGLang minimum new tokens.
    min_new_tokens: NonNegInt | None = None
    #: SGLang frequency penalty.
    frequency_penalty: float | None = None
    #: SGLang presence penalty.
    presence_penalty: float | None = None
    #: SGLang repetition penalty.
    repetition_penalty: PosFloat | None = None
    #: Stop strings.
    stop: list[str] | None = None
    #: Stop token ids.
    stop_token_ids: list[int] | None = None
    #: Keep generating past EOS.
    ignore_eos: bool | None = None
    #: Drop special tokens from the text.
    skip_special_tokens: bool | None = None
    #: Keep the stop string in the text.
    no_stop_trim: bool | None = None

    def params(self) -> dict[str, object]:
        """The keys that are set, as SGLang's ``sampling_params``."""
        return {name: getattr(self, name) for name in self.__struct_fields__
                if getattr(self, name) is not None}


class WorkflowConfig(_Section):
    #: Episode workflow: `controlled_length`, `controlled_turns`, `generate`, `math`, `noop`
    #: or `package.module:factory`.
    name: str = "controlled_length"
    #: Run seed; an episode's sampling seed derives from (seed, prompt id, member).
    seed: NonNegInt = 0
    sampling: SamplingConfig = msgspec.field(default_factory=SamplingConfig)


class EngineConfig(_Section):
    #: `sim` (simulated replicas), `sglang` or `vllm` (its server with
    #: `VLLM_SERVER_DEV_MODE=1` and `--enable-scale-out`).
    kind: Literal["sim", "sglang", "vllm"] = "sim"
    #: `up` with sglang or vllm: the replicas' URLs.
    urls: list[str] = msgspec.field(default_factory=list)
    #: `up` with sim: replicas to start.
    replicas: PosInt = 8
    #: Concurrent episodes per replica / GPU (SGLang's `--max-running-requests`).
    slots_per_replica: PosInt = 16
    #: A worker's episode slots per process, as threads (1: a process per slot). Unset: a
    #: replica's slots in one process with `sim`, a process per slot with `sglang`.
    threads_per_process: PosInt | None = None
    #: sim: decode step time with one running request (ms).
    step_ms: PosFloat = 4.5
    #: sim: added to the step per running request (ms).
    step_ms_per_request: NonNegFloat = 0.2
    #: sim: uncached context tokens computed per second; prefill stalls decode.
    prefill_tokens_per_s: PosFloat = 20_000.0
    #: sim: most tokens in one prefill round (SGLang's `--chunked-prefill-size`).
    chunked_prefill_size: PosInt = 8192
    #: sim: KV pool in tokens, shared by running requests and the prefix cache (SGLang's
    #: `--max-total-tokens`); at least one chunk.
    max_total_tokens: PosInt = 220_000
    #: How a pause stops generation: `in_place` (KV kept), `abort` (partial rollout resumed
    #: under the new weights; its context cached) or `retract` (KV freed, recomputed on
    #: resume).
    pause_mode: PauseMode = "in_place"
    #: true: each worker reads its replica's `/metrics` and sets how many of its slots take
    #: new jobs (halved on a retraction or a token usage above 0.90, one more a look while
    #: there is room); its registered slots, and `"auto"` capacity, follow.
    adaptive_slots: bool = False
    #: Adaptive slots: the lowest limit a worker sets (the highest is `slots_per_replica`);
    #: at most `slots_per_replica`.
    min_slots_per_replica: PosInt = 1
    #: Adaptive slots: seconds between a worker's looks at its replica's `/metrics`.
    adaptive_interval_s: PosFloat = 1.0
    #: `node` with sglang or vllm: the model to serve.
    model_path: str = ""
    #: `node` with sglang or vllm: the Python that has the engine and runs the replicas;
    #: empty: the environment variable `QUEUE_ROLLOUT_SGLANG_PYTHON` (sglang) or
    #: `QUEUE_ROLLOUT_VLLM_PYTHON` (vllm), else the Python of `queue-rollout` itself. `node`
    #: refuses to start when it cannot import the engine.
    python: str = ""
    #: `node`: replica i listens on base_port + i.
    base_port: Port = 30000
    #: `node`: pass `--enable-deterministic-inference` (a retry reproduces its episode). A
    #: CPU server (`--device cpu`) refuses it: set false there.
    deterministic: bool = True
    #: `node`: extra SGLang launch arguments, passed through; with `--device cpu` the
    #: replicas also get `SGLANG_USE_CPU_ENGINE=1`.
    sglang_args: list[str] = msgspec.field(default_factory=list)
    #: `node` with vllm: extra launch arguments of vLLM's server, passed through (after
    #: `--enable-scale-out` and `--max-num-seqs slots_per_replica`); its servers get
    #: `VLLM_SERVER_DEV_MODE=1`.
    vllm_args: list[str] = msgspec.field(default_factory=list)

    @property
    def episode_threads(self) -> int:
        """A worker's episode slots per process: ``threads_per_process``, else every slot
        with ``sim`` replicas and one with ``sglang``; never more than the slots."""
        per = self.threads_per_process or (self.slots_per_replica if self.kind == "sim" else 1)
        return min(per, self.slots_per_replica)

    @property
    def episode_processes(self) -> int:
        """A worker's episode processes."""
        return -(-self.slots_per_replica // self.episode_threads)


class CollectorConfig(_Section):
    #: The collector's round (admission, the outbox, judgement, the reconciler) runs this
    #: often (ms). Lower it only for a farm whose episodes take well under a second (the
    #: benchmarks scale it with time).
    step_ms: PosFloat = 200.0


class LimitsConfig(_Section):
    #: Largest prompt accepted (bytes of JSON).
    max_prompt_bytes: PosInt = 1_048_576
    #: Largest episode result; a larger one fails its episode.
    max_result_bytes: PosInt = 16_777_216
    #: Most turns of one member in a prompt's `member_turns` (`controlled_turns`); a longer
    #: member refuses the prompt.
    max_turns: PosInt = 256


class MetricsConfig(_Section):
    #: Address the metrics endpoint binds.
    host: str = "127.0.0.1"
    #: Port of `/metrics` and `/healthz`.
    port: Port = 9464


class HistoryConfig(_Section):
    """Each admitted group's story (``trace``), kept in Redis for the last
    ``max_groups`` groups admitted within ``ttl_s``; ``max_groups = 0`` keeps none."""

    #: Groups whose story `trace` can tell (admission, each attempt, judgement, batch, ack):
    #: the last this many admitted; the oldest beyond leave. 0: no history is kept.
    max_groups: NonNegInt = 10_000
    #: Seconds a group's story is kept after its admission.
    ttl_s: PosInt = 86_400


class CellConfig(_Section):
    """One cell of a farm spread over several Redis servers (``[[cells]]``): its own
    Redis holds its groups' slots, attempts and results, its job queues and its
    workers; ``farm.redis_url`` is then the control Redis (the farm-wide version, pause,
    staleness budget and batches)."""

    #: The cell's name: a node's workers join it (`node --cell NAME`), and the control
    #: Redis's record of each group names the cell that runs it.
    name: FarmName
    #: The cell's Redis, as farm.redis_url takes one (TLS and Sentinel with the farm's
    #: redis_ca_file and sentinel_password). Empty: the one `up` starts for the cell,
    #: found through `<state_dir>/cells/<name>`, the cell's own folder.
    redis_url: str = ""
    #: The cell's share, against the other cells' weights, of the new prompts (each goes
    #: to the cell its id hashes to) and of a capacity given as a number.
    weight: PosFloat = 1.0


class Config(_Section):
    farm: FarmConfig = msgspec.field(default_factory=FarmConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    timeouts: TimeoutsConfig = msgspec.field(default_factory=TimeoutsConfig)
    acceptance: AcceptanceConfig = msgspec.field(default_factory=AcceptanceConfig)
    workflow: WorkflowConfig = msgspec.field(default_factory=WorkflowConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    collector: CollectorConfig = msgspec.field(default_factory=CollectorConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    history: HistoryConfig = msgspec.field(default_factory=HistoryConfig)
    cells: list[CellConfig] = msgspec.field(default_factory=list)

    def cell_weights(self) -> dict[str, float]:
        """Each cell's weight by name (none on a farm of one Redis)."""
        return {c.name: c.weight for c in self.cells}

    def for_cell(self, name: str) -> Config:
        """The farm as cell *name*'s workers and collector see it: a farm of one on the
        cell's Redis, with the cell's share (by weight, rounded down) of a capacity
        given as a number, and ``<state_dir>/cells/<name>`` for its state_dir (a node's
        files, and the Redis `up` starts for a cell without a URL). ConfigError when
        there is no such cell."""
        cell = next((c for c in self.cells if c.name == name), None)
        if cell is None:
            known = ", ".join(c.name for c in self.cells) or "none"
            raise ConfigError(f"no cell {name!r} in [[cells]] (cells: {known})")
        share = cell.weight / sum(c.weight for c in self.cells)
        r = self.rollout
        samples = (r.max_concurrent_samples if not isinstance(r.max_concurrent_samples, int)
                   else int(r.max_concurrent_samples * share))
        state_dir = str(Path(self.farm.state_dir) / "cells" / name)
        return msgspec.structs.replace(
            self, farm=msgspec.structs.replace(self.farm, redis_url=cell.redis_url,
                                               state_dir=state_dir),
            rollout=msgspec.structs.replace(
                r, max_concurrent_samples=samples,
                max_concurrent_rollouts=int(r.max_concurrent_rollouts * share)),
            cells=[])


_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$", re.DOTALL)


def _known_keys(path: str) -> list[str]:
    """The keys of the table at dotted *path* of :class:`Config` ([] when not a table)."""
    cls: object = Config
    for part in [p for p in path.split(".") if p]:
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
            return []
        cls = typing.get_type_hints(cls).get(part)
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return list(cls.__struct_fields__)
    return []


def _field_type(path: str) -> object:
    """The annotation of the field at dotted *path* of :class:`Config` (None if none)."""
    cls: object = Config
    for part in [p for p in path.split(".") if p]:
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
            return None
        cls = typing.get_type_hints(cls, include_extras=True).get(part)
    return cls


def _accepted(path: str) -> str:
    """What the field at *path* takes, when some of it is a fixed set of words:
    ``an integer > 0 or "auto"`` ("" otherwise)."""
    options: list[str] = []
    words = False
    field = _field_type(path)
    union = typing.get_origin(field) in (typing.Union, types.UnionType)
    for member in typing.get_args(field) if union else [field]:
        if typing.get_origin(member) is Literal:
            options += [f'"{v}"' for v in typing.get_args(member)]
            words = True
        elif typing.get_origin(member) is Annotated:
            base, *metas = typing.get_args(member)
            bounds = [f"> {m.gt}" if m.gt is not None else f">= {m.ge}" for m in metas
                      if isinstance(m, msgspec.Meta) and (m.gt is not None or m.ge is not None)]
            name = {int: "an integer", float: "a number"}.get(base, "")
            if name:
                options.append(" ".join([name, *bounds[:1]]))
    return " or ".join(options) if words else ""


def _nested_key(table: str, name: str) -> str:
    """The dotted key of a field *name* one table below *table* (``workflow`` +
    ``temperature`` -> ``workflow.sampling.temperature``), "" when there is none."""
    for sub in _known_keys(table):
        if name in _known_keys(f"{table}.{sub}"):
            return f"{table + '.' if table else ''}{sub}.{name}"
    return ""


def _name_the_key(message: str) -> str:
    """``Expected `int`, got `bool` - at `$.rollout.group_size` `` ->
    ``rollout.group_size: Expected `int`, got `bool```; an unknown key ->
    ``rollout.grup_size: unknown key (did you mean group_size?)``, or one that belongs a
    table lower (``workflow.temperature`` -> ``did you mean
    workflow.sampling.temperature?``); a word not among those a key takes names them."""
    m = _PATH.search(message)
    key = m.group(1).replace("[", ".").replace("]", "") if m else ""
    text = message[: m.start()] if m else message
    unknown = _UNKNOWN.match(text)
    if unknown:
        name = unknown.group(1)
        close = difflib.get_close_matches(name, _known_keys(key), n=1)
        lower = "" if close else _nested_key(key, name)
        hint = f" (did you mean {close[0] if close else lower}?)" if close or lower else ""
        return f"{key + '.' if key else ''}{name}: unknown key{hint}"
    if key and text.startswith("Invalid enum value") and (accepted := _accepted(key)):
        text += f" (it takes {accepted})"
    return f"{key}: {text}" if key else text


def _check(config: Config, source: str) -> Config:
    name = config.workflow.name
    try:
        if name not in BUILT_IN_WORKFLOWS:
            if ":" not in name:
                raise ConfigError(f"workflow.name: {name!r} is neither a built-in "
                                  f"({', '.join(BUILT_IN_WORKFLOWS)}) nor "
                                  "package.module:factory")
            load_reference(name, "workflow.name")
        if config.acceptance.plugin:
            load_reference(config.acceptance.plugin, "acceptance.plugin")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    e = config.engine
    if e.max_total_tokens < e.chunked_prefill_size:
        raise ConfigError(
            f"{source}: engine.max_total_tokens: a pool of {e.max_total_tokens} tokens is "
            f"smaller than one prefill chunk (engine.chunked_prefill_size = "
            f"{e.chunked_prefill_size})"
        )
    if e.min_slots_per_replica > e.slots_per_replica:
        raise ConfigError(
            f"{source}: engine.min_slots_per_replica: {e.min_slots_per_replica} is above "
            f"engine.slots_per_replica = {e.slots_per_replica}, the highest limit"
        )
    t = config.timeouts
    if t.clock_skew is not None and t.clock_skew > t.lease / 3:
        raise ConfigError(
            f"{source}: timeouts.clock_skew: {t.clock_skew:g} s is more than lease / 3 = "
            f"{t.lease / 3:g} s (timeouts.lease = {t.lease}): two clocks that far from "
            "Redis's could expire a lease that is being renewed; raise timeouts.lease or "
            "set the clocks right"
        )
    if config.engine.kind == "vllm" and config.engine.pause_mode != "abort":
        raise ConfigError(
            f"{source}: engine.pause_mode: {config.engine.pause_mode!r} with vllm: a weight "
            "update in it preempts the running requests, and a vLLM CPU engine with seeded "
            "requests dies when one resumes (vLLM 0.32.0); use \"abort\""
        )
    r = config.rollout
    if isinstance(r.max_concurrent_samples, int) and r.max_concurrent_samples < r.group_size:
        raise ConfigError(
            f"{source}: rollout.max_concurrent_samples: {r.max_concurrent_samples} slots "
            f"cannot hold one group of rollout.group_size = {r.group_size}"
        )
    _check_cells(config, source)
    return config


def _check_cells(config: Config, source: str) -> None:
    if not config.cells:
        return
    names = [c.name for c in config.cells]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{source}: cells: a cell named twice: {', '.join(twice)}")
    r = config.rollout
    for c in config.cells:
        share = config.for_cell(c.name).rollout
        if isinstance(share.max_concurrent_samples, int) and (
                share.max_concurrent_samples < r.group_size):
            raise ConfigError(
                f"{source}: rollout.max_concurrent_samples: cell {c.name}'s share "
                f"(weight {c.weight:g}) is {share.max_concurrent_samples} slots, less than "
                f"one group of rollout.group_size = {r.group_size}")
        if r.max_concurrent_samples is None and share.max_concurrent_rollouts < 1:
            raise ConfigError(
                f"{source}: cells: cell {c.name}'s share (weight {c.weight:g}) of "
                f"rollout.max_concurrent_rollouts = {r.max_concurrent_rollouts} groups is none")


def decode_config(data: bytes | str, source: str = "config") -> Config:
    """Decode TOML text into a :class:`Config`; errors name the key (or the line)."""
    if not isinstance(data, str):
        raw = bytes(data)
        try:
            data = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise ConfigError(f"{source}:{line}: not UTF-8 text") from None
    try:
        config = msgspec.toml.decode(data, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_name_the_key(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except ValueError as exc:  # tomllib: an int over sys.get_int_max_str_digits() digits
        why = "a number has too many digits" if "digits" in str(exc) else str(exc)
        raise ConfigError(f"{source}: not valid TOML: {why}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: nested too deeply") from None
    return _check(config, source)


def _toml_value(value: object) -> str:
    """A TOML literal for a str, bool, int, float or list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_TOML_ESCAPES.get(c) or (
            f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {type(value).__name__}")


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
                 "\f": "\\f", "\r": "\\r"}


def to_toml(config: Config) -> str:
    """The config as TOML that :func:`decode_config` reads back unchanged."""
    def section(name: str, values: dict[str, Any]) -> list[str]:
        lines = [f"[{name}]"]
        nested = []
        for key, value in values.items():
            if isinstance(value, dict):
                nested.append((f"{name}.{key}", value))
            elif value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        for sub, sub_values in nested:
            lines += ["", *section(sub, sub_values)]
        return lines

    out: list[str] = []
    for name, values in msgspec.to_builtins(config).items():
        if isinstance(values, list):  # an array of tables ([[cells]])
            for item in values:
                out += [f"[[{name}]]", *section(name, item)[1:], ""]
        else:
            out += [*section(name, values), ""]
    return "\n".join(out)


def write_config(path: Path, config: Config) -> None:
    """Write *config* as TOML readable by its owner only (it may hold the Redis
    password); an existing file is made private before it is rewritten."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(to_toml(config))


def load_config(path: str | Path | None) -> Config:
    """The built-in defaults when *path* is None, else the TOML file at *path*."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from None
    return decode_config(data, source=str(p))
