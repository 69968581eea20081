"""AReaL's ``InferenceEngine`` backed by a queue-rollout farm.

    from queue_rollout import RolloutClient
    from queue_rollout.integrations.areal import FarmInferenceEngine

    rollout = FarmInferenceEngine(
        RolloutClient.from_config("farm.toml"),
        workflows={"areal.workflow.rlvr.RLVRWorkflow": "my_tasks:MathWorkflow"},
        experiment_name=config.experiment_name, trial_name=config.trial_name)
    rollout.initialize()
    batch = rollout.prepare_batch(dataloader, workflow="areal.workflow.rlvr.RLVRWorkflow",
                                  workflow_kwargs=..., group_size=G)

It implements the ``InferenceEngine`` of AReaL 1.0.4 (``areal/api/engine_api.py``) in
the order AReaL's trainer drives it (``areal/trainer/rl_trainer.py``): ``prepare_batch``,
``pause``, the disk weight update (``pause_generation``, ``update_weights_from_disk``,
the trainer saves and signals, the future completes once every replica loaded the
checkpoint, ``continue_generation``), ``set_version``, ``resume``.

What the farm replaces. AReaL runs ``workflow.arun_episode`` in the trainer's process
against the engine's ``agenerate``; here episodes run on the farm's workers under the
farm's configured workflow (``workflow.name``). ``workflows`` maps each AReaL workflow a
trainer asks for, by import path, to the farm workflow that runs it; a workflow the map
does not name, or one that maps to a workflow the farm does not run, is refused, and so
is ``agenerate``. Rewards are the farm workflow's (AReaL's ``reward_fn`` is not called),
so the farm's ``acceptance`` rules apply; AReaL's ``should_accept_fn`` is refused (set
the farm's rules instead). AReaL's ``StalenessManager`` is the farm's staleness budget,
kept in the ledger (the same formula: accepted and running groups <= (max_staleness +
version + 1) x B); :attr:`workflow_executor` offers what AReaL's trainer reaches through
it. A prompt's token ids are made by the AReaL workflow's own ``get_input_ids_fn`` where
it has one (``RLVRWorkflow``), else the dataset item's ``input_ids`` are sent.

What it returns: AReaL's per-group batch dicts (``input_ids``, ``loss_mask``,
``logprobs``, ``versions``, ``attention_mask``, ``rewards``; batch dimension first, one
row per member), built from the training view of each delivered group, so a produced
token older than the staleness window (a member that spanned weight updates) is out of
``loss_mask``. A delivered batch is acknowledged when AReaL next sets the policy
version (its step is trained); a trainer that dies before is handed the batch again.

Needs AReaL 1.0.x and torch where they are used (``pip install 'queue-rollout[areal]'``
beside the trainer's AReaL; AReaL's API modules alone suffice, as the Frameworks page
says); importing this module loads neither.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from queue_rollout.client.rollout import Batch, RolloutClient
from queue_rollout.client.training import Sample
from queue_rollout.errors import BadInput, BarrierTimeout

log = logging.getLogger(__name__)

#: the AReaL release whose InferenceEngine (signatures and trainer order) this follows
AREAL_VERSION = "1.0.4"
#: how often waiting for a batch polls the ledger, at most
POLL_S = 0.05


def workflow_path(workflow: Any) -> str:
    """AReaL's workflow (an import path, a class, an instance) as its import path."""
    if isinstance(workflow, str):
        return workflow
    cls = workflow if isinstance(workflow, type) else type(workflow)
    return f"{cls.__module__}.{cls.__qualname__}"


def group_dict(samples: list[Sample]) -> dict[str, Any] | None:
    """One group's members as AReaL's batch dict of tensors (one row per member,
    right-padded as AReaL pads a group); None when no member produced anything (AReaL's
    rejected)."""
    import torch
    from areal.utils.data import concat_padded_tensors

    rows = []
    for s in samples:
        if s.reward is None:  # a failed member (no output): AReaL leaves it out
            continue
        rows.append({
            "input_ids": torch.tensor([s.input_ids], dtype=torch.int32),
            "loss_mask": torch.tensor([[m & (1 - st) for m, st in zip(
                s.loss_mask, s.stale_mask, strict=True)]], dtype=torch.int32),
            "logprobs": torch.tensor([s.logprobs], dtype=torch.float32),
            "versions": torch.tensor([s.versions], dtype=torch.int32),
            "attention_mask": torch.ones((1, len(s.input_ids)), dtype=torch.bool),
            "rewards": torch.tensor([s.reward], dtype=torch.float32),
        })
    return concat_padded_tensors(rows) if rows else None


def cycle(dataloader: Any) -> Iterator[dict[str, Any]]:
    """The dataloader's items, epoch after epoch (each of its batches a list of items,
    as AReaL's loaders give them)."""
    while True:
        seen = 0
        for items in dataloader:
            for item in items:
                seen += 1
                yield item
        if not seen:
            raise BadInput("the dataloader gave no item")


class FarmStaleness:
    """Stands in for AReaL's ``StalenessManager``: the budget is the farm's, in the
    ledger. AReaL's trainer calls :meth:`on_version_recovered` after a recovery; the
    farm's ``set_version`` already counts the consumed groups as ``version x B``."""

    def __init__(self, client: RolloutClient) -> None:
        self.client = client
        self.max_staleness = client.config.rollout.max_staleness
        self.consumer_batch_size = client.config.rollout.batch_size

    def on_version_recovered(self, version: int) -> None:
        self.client.set_version(version)

    def get_stats(self) -> Any:
        from areal.api.io_struct import RolloutStat

        g = self.client.status()["groups"]
        return RolloutStat(accepted=g["accepted"], enqueued=g["pending"],
                           rejected=g["rejected"], running=g["in_flight"])


class FarmExecutor:
    """What AReaL's trainer reaches through ``engine.workflow_executor``."""

    def __init__(self, staleness_manager: FarmStaleness) -> None:
        self.staleness_manager = staleness_manager


class FarmInferenceEngine:
    """AReaL's inference engine over a farm. ``workflows`` maps AReaL workflow import
    paths to farm workflow names; ``experiment_name`` and ``trial_name`` are AReaL's
    (its trainer signals a saved checkpoint under them); ``timeout`` bounds each wait
    for groups, in seconds. It offers the methods of AReaL's ``InferenceEngine`` (AReaL
    calls its engine's methods and checks no type), so importing this module imports
    neither AReaL nor torch: they load where they are used."""

    def __init__(self, client: RolloutClient, *, workflows: Mapping[str, str],
                 experiment_name: str | None = None, trial_name: str | None = None,
                 timeout: float | None = 600.0, saved_timeout: float = 120.0,
                 run_id: str | None = None) -> None:
        self.client = client
        self.workflows = dict(workflows)
        self.experiment_name, self.trial_name = experiment_name, trial_name
        self.timeout = timeout
        self.saved_timeout = saved_timeout  # waiting for the trainer's "saved" signal
        #: the prefix of this engine's group ids (the farm refuses an id it knows)
        self.run_id = run_id or f"areal-{uuid.uuid4().hex[:12]}"
        self._executor = FarmExecutor(FarmStaleness(client))
        self._loader: ThreadPoolExecutor | None = None
        self._initialized = False
        self._paused = False  # by pause() or pause_generation()
        self._paused_by_generation = False
        self._tasks = itertools.count()
        self._group_of: dict[int, str] = {}  # task id -> group id
        self._ready: OrderedDict[str, dict[str, Any] | None] = OrderedDict()
        self._unacked: list[Batch] = []  # the batch handed over, acked at set_version
        self._outstanding: set[str] = set()  # groups submitted, not yet handed to AReaL
        #: prepare_batch's dataset items and workflow arguments, from its first call
        self._feed: tuple[Iterator[dict[str, Any]], Any, dict[str, Any] | None, int] | None = None
        self._workflows: dict[str, Any] = {}  # resolved AReaL workflows, by path
        self._stats: list[dict[str, float]] = []
        #: the last delivered farm batch (the groups behind the last dicts returned)
        self.last_batch: Batch | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        self.client.version()  # reaches the ledger, or raises naming it
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="farm-weights")
        self._initialized = True

    def destroy(self) -> None:
        """Stops the engine; a batch delivered and not acknowledged (its step did not
        finish) is handed to this consumer again when it comes back."""
        if self._loader is not None:
            self._loader.shutdown(wait=True)
            self._loader = None
        self._initialized = False

    @property
    def initialized(self) -> bool:
        return self._initialized

    @property
    def workflow_executor(self) -> FarmExecutor:
        return self._executor

    def config_perf_tracer(self, config: Any, rank: int, role: str) -> None:
        """AReaL's trainer configures its engines' tracers; a farm engine traces nothing."""

    def save_perf_tracer(self, step: int | None = None, force: bool = False) -> None:
        """Nothing traced, nothing to save."""

    def offload(self) -> None:
        raise NotImplementedError("a farm's replicas are not the trainer's to offload")

    def onload(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("a farm's replicas are not the trainer's to onload")

    async def agenerate(self, req: Any) -> Any:
        raise NotImplementedError(
            "a farm engine does not generate for AReaL's workflows: episodes run on the "
            "farm's workers under the farm's workflow; use submit/wait, rollout_batch or "
            "prepare_batch with an AReaL workflow named in FarmInferenceEngine(workflows=)")

    # -- submission -----------------------------------------------------------------------

    def _check(self, workflow: Any, workflow_kwargs: dict[str, Any] | None,
               should_accept_fn: Any, group_size: int, is_eval: bool = False) -> None:
        """Refuses what the farm cannot serve, before anything is submitted."""
        config = self.client.config
        if is_eval:
            raise BadInput("evaluation through the farm is not supported: the farm's "
                           "batches go to training; evaluate with an engine of its own")
        if should_accept_fn is not None:
            raise BadInput("should_accept_fn is not supported: the farm judges groups with "
                           "its acceptance rules (acceptance.reject_zero_variance, "
                           "acceptance.plugin); set those instead")
        if group_size != config.rollout.group_size:
            raise BadInput(f"group_size = {group_size}, but the farm's groups are "
                           f"rollout.group_size = {config.rollout.group_size}: make them "
                           "equal (AReaL's gconfig.n_samples)")
        path = workflow_path(workflow)
        farm_workflow = self.workflows.get(path)
        if farm_workflow is None:
            raise BadInput(f"AReaL workflow {path!r} has no farm workflow: name it in "
                           f"FarmInferenceEngine(workflows={{{path!r}: FARM_WORKFLOW}})")
        if farm_workflow != config.workflow.name:
            raise BadInput(f"AReaL workflow {path!r} maps to farm workflow "
                           f"{farm_workflow!r}, but the farm runs {config.workflow.name!r}")
        gconfig = (workflow_kwargs or {}).get("gconfig", getattr(workflow, "gconfig", None))
        temperature = config.workflow.sampling.temperature
        if gconfig is not None and getattr(gconfig, "temperature", temperature) != temperature:
            raise BadInput(f"AReaL's gconfig.temperature {gconfig.temperature} is not the "
                           f"farm's (workflow.sampling.temperature = {temperature}): the "
                           "trainer's logprobs must be taken at the replicas' temperature")

    def _prompt(self, data: dict[str, Any], workflow: Any,
                kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The farm prompt of a dataset item: its fields but ``id``; an item without
        ``input_ids`` gets them from the AReaL workflow's own ``get_input_ids_fn``
        (the workflow resolved as AReaL resolves it: an instance as is, a class or an
        import path built with *kwargs*; only its tokenization is used)."""
        prompt = {k: v for k, v in data.items() if k != "id"}
        if "input_ids" in prompt:
            return prompt
        path = workflow_path(workflow)
        if path not in self._workflows:
            from areal.utils.dynamic_import import import_from_string

            if isinstance(workflow, str):
                workflow = import_from_string(workflow)
            self._workflows[path] = (workflow(**(kwargs or {})) if isinstance(workflow, type)
                                     else workflow)
        resolved = self._workflows[path]
        if not hasattr(resolved, "get_input_ids_fn"):
            raise BadInput(f"the item has no input_ids, and AReaL workflow {path!r} has no "
                           "get_input_ids_fn to make them")
        prompt["input_ids"] = list(resolved.get_input_ids_fn(
            resolved.data_extract_prompt_fn(data), resolved.tokenizer,
            resolved.enable_thinking))
        return prompt

    def submit(self, data: dict[str, Any], workflow: Any,
               workflow_kwargs: dict[str, Any] | None = None,
               should_accept_fn: Callable[..., Any] | None = None, group_size: int = 1,
               task_id: int | None = None, is_eval: bool = False) -> int:
        """Submits *data* as one group of the farm; returns its task id."""
        self._check(workflow, workflow_kwargs, should_accept_fn, group_size, is_eval)
        task = next(self._tasks) if task_id is None else task_id
        if task in self._group_of:
            raise BadInput(f"task id {task} was submitted already")
        gid = f"{self.run_id}-{task:06d}"
        self.client.submit([{**self._prompt(data, workflow, workflow_kwargs), "id": gid}])
        self._group_of[task] = gid
        self._outstanding.add(gid)
        return task

    # -- waiting --------------------------------------------------------------------------

    def _fetch(self, deadline: float | None) -> None:
        """One delivered batch into the ready groups; TimeoutError past *deadline*. The
        farm hands a consumer one batch at a time (until it is acknowledged), so one
        already held is refused."""
        if self._unacked:
            raise BadInput(f"this engine holds farm batch {self._unacked[0].id}, not yet "
                           "acknowledged, and the farm hands a consumer one batch at a "
                           "time: call set_version after training on it, then wait for more")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        started = time.monotonic()
        try:
            batch = self.client.get_batch(left, max_poll_s=POLL_S)
        except BarrierTimeout as exc:
            raise TimeoutError(str(exc)) from None
        version = self.client.version()
        view = batch.training_view(version, self.client.config.rollout.max_staleness)
        for group, samples in zip(batch.groups, view.groups(), strict=True):
            self._ready[group.id] = group_dict(samples)
        self._unacked.append(batch)
        self.last_batch = batch
        rewards = [s.reward for s in view.samples if s.reward is not None]
        self._stats.append({"wait_s": time.monotonic() - started,
                            "groups": float(len(batch.groups)),
                            "reward": statistics.fmean(rewards) if rewards else 0.0,
                            "masked_share": view.masked_share() if rewards else 0.0,
                            "staleness": statistics.fmean(version - g.version
                                                          for g in batch.groups)})

    def _deadline(self, timeout: float | None) -> float | None:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def _take(self, gid: str) -> dict[str, Any] | None:
        self._outstanding.discard(gid)  # a batch redelivered from before a restart holds
        return self._ready.pop(gid)     # groups this engine did not submit

    def wait(self, count: int, timeout: float | None = None,
             raise_timeout: bool = True) -> list[dict[str, Any] | None]:
        """*count* groups, as the farm delivers them (None: a group with no output)."""
        deadline = self._deadline(timeout)
        try:
            while len(self._ready) < count:
                self._fetch(deadline)
        except TimeoutError:
            if raise_timeout:
                raise
            return []
        return [self._take(gid) for gid in list(self._ready)[:count]]

    def wait_for_task(self, task_id: int, timeout: float | None = None,
                      raise_timeout: bool = True) -> dict[str, Any] | None:
        gid = self._group_of.get(task_id)
        if gid is None:
            raise BadInput(f"no task {task_id} was submitted to this engine")
        deadline = self._deadline(timeout)
        try:
            while gid not in self._ready:
                self._fetch(deadline)
        except TimeoutError:
            if raise_timeout:
                raise
            return None
        return self._take(gid)

    def rollout_batch(self, data: list[dict[str, Any]], workflow: Any,
                      workflow_kwargs: dict[str, Any] | None = None,
                      group_size: int = 1) -> list[dict[str, Any]]:
        """Submits *data*, one group each, and returns their dicts in *data*'s order
        (groups with no output left out). At most one farm batch (``rollout.batch_size``
        items): the farm hands out one batch at a time; fewer items wait for other
        groups to fill the batch."""
        b = self.client.config.rollout.batch_size
        if len(data) > b:
            raise BadInput(f"rollout_batch of {len(data)} items: the farm hands out one "
                           f"batch of rollout.batch_size = {b} groups at a time")
        tasks = [self.submit(d, workflow, workflow_kwargs, group_size=group_size)
                 for d in data]
        results = [self.wait_for_task(t) for t in tasks]
        return [r for r in results if r is not None]

    def prepare_batch(self, dataloader: Any, workflow: Any,
                      workflow_kwargs: dict[str, Any] | None = None,
                      should_accept_fn: Callable[..., Any] | None = None,
                      group_size: int = 1, dynamic_bs: bool = False) -> list[dict[str, Any]]:
        """The next batch: ``dataloader.batch_size`` groups (one farm batch). The farm is
        kept fed from the dataloader (the staleness budget ahead of the trainer, plus a
        batch); as in AReaL, the arguments of the first call are kept."""
        rollout = self.client.config.rollout
        if dataloader.batch_size != rollout.batch_size:
            raise BadInput(f"the dataloader's batch_size {dataloader.batch_size} is not the "
                           f"farm's rollout.batch_size = {rollout.batch_size}: make them equal")
        if self._feed is None:
            self._check(workflow, workflow_kwargs, should_accept_fn, group_size)
            self._feed = (cycle(dataloader), workflow, workflow_kwargs, group_size)
        items, workflow, workflow_kwargs, group_size = self._feed
        ahead = (rollout.max_staleness + 2) * rollout.batch_size
        while len(self._outstanding) < ahead:
            self.submit(next(items), workflow, workflow_kwargs, group_size=group_size)
        results = self.wait(rollout.batch_size)
        return [r for r in results if r is not None]

    # -- weights and versions -------------------------------------------------------------

    def pause(self) -> None:
        """Stops admission and pauses every replica (the farm's pause barrier)."""
        if not self._paused:
            self.client.pause()
        self._paused, self._paused_by_generation = True, False

    def resume(self) -> None:
        self.client.resume()
        self._paused = self._paused_by_generation = False

    def pause_generation(self) -> None:
        """Pauses every replica; within :meth:`pause` it has nothing left to do."""
        if not self._paused:
            self.client.pause()
            self._paused = self._paused_by_generation = True

    def continue_generation(self) -> None:
        """Resumes what :meth:`pause_generation` paused; after :meth:`pause`, generation
        resumes with :meth:`resume`."""
        if self._paused_by_generation:
            self.resume()

    def update_weights_from_disk(self, meta: Any) -> Future[None]:
        """Every replica loads ``meta.path`` as version ``meta.version``, once AReaL's
        trainer has signalled it saved (``names.update_weights_from_disk`` under this
        engine's version, as AReaL's remote engines wait); the future completes when
        all did. Call it paused."""
        if meta.type != "disk" or not meta.path:
            raise BadInput(f"a farm engine loads weights from disk (a path), not by "
                           f"{meta.type!r}")
        if self.experiment_name is None or self.trial_name is None:
            raise BadInput("experiment_name and trial_name must be given for disk weight "
                           "updates: AReaL's trainer signals a saved checkpoint under them")
        if not self._paused:
            raise BadInput("update_weights_from_disk outside a pause: call "
                           "pause_generation() first, as AReaL's trainer does")
        if self._loader is None:
            raise BadInput("the engine is not initialized: call initialize() first")
        from areal.utils import name_resolve, names

        current = self.get_version()
        version = meta.version if meta.version is not None else current + 1
        signal = names.update_weights_from_disk(self.experiment_name, self.trial_name,
                                                current)
        path = meta.path

        def load() -> None:
            name_resolve.wait(signal, timeout=self.saved_timeout, poll_frequency=0.05)
            self.client.load_weights(path, version)

        return self._loader.submit(load)

    def set_version(self, version: int) -> None:
        """The trainer's step is done: the batches handed to it are acknowledged, then
        the farm's policy version is *version*."""
        for batch in self._unacked:
            self.client.ack(batch)
        self._unacked = []
        self.client.set_version(version)

    def get_version(self) -> int:
        return self.client.version()

    def export_stats(self) -> dict[str, float]:
        """The farm's figures since the last export: batches, groups, the mean wait for
        a batch (s), sampled reward, masked share of produced tokens, staleness."""
        rows, self._stats = self._stats, []
        if not rows:
            return {}
        out = {"farm/batches": float(len(rows)),
               "farm/groups": sum(r["groups"] for r in rows)}
        for key in ("wait_s", "reward", "masked_share", "staleness"):
            out[f"farm/{key}"] = statistics.fmean(r[key] for r in rows)
        return out



#: ``PPOTrainer._init_rollout``'s parameters in AReaL 1.0.x: the one place its trainer
#: builds the rollout engine, from ``rollout.backend``. AReaL offers no public way to
#: hand the trainer an engine, so :func:`with_farm_rollout` overrides this private
#: method, and refuses a trainer whose method has other parameters.
ROLLOUT_HOOK = ("self", "rollout_config", "is_eval", "lora_path")


def with_farm_rollout(trainer_cls: type, make_engine: Callable[[Any], FarmInferenceEngine]
                      ) -> type:
    """A subclass of AReaL's ``PPOTrainer`` (or of a trainer derived from it) whose
    training rollout is the farm: ``make_engine(rollout_config)`` builds the
    :class:`FarmInferenceEngine` (initialized here). Evaluation keeps AReaL's own engine
    (the farm does not evaluate). A trainer class without AReaL 1.0.x's
    ``_init_rollout(self, rollout_config, is_eval, lora_path)`` is refused
    (:class:`~queue_rollout.errors.BadInput`, naming what it found)."""
    import inspect
    from importlib import metadata

    hook = getattr(trainer_cls, "_init_rollout", None)
    found = (tuple(inspect.signature(hook).parameters) if callable(hook) else None)
    if not callable(hook) or found != ROLLOUT_HOOK:
        try:
            version = f"AReaL {metadata.version('areal')}"
        except metadata.PackageNotFoundError:
            version = "this AReaL"
        what = "has none" if found is None else f"takes ({', '.join(found)})"
        raise BadInput(
            f"{version}: {trainer_cls.__qualname__}._init_rollout {what}, where AReaL "
            f"{AREAL_VERSION} takes ({', '.join(ROLLOUT_HOOK)}); the farm's engine "
            "cannot take the rollout's place in this trainer. Build the engine yourself "
            "(FarmInferenceEngine) in a training loop of your own, or use an AReaL 1.0.x")

    def _init_rollout(self: Any, rollout_config: Any, is_eval: bool = False,
                      lora_path: str | None = None) -> Any:
        if is_eval:  # AReaL's own engine, on its own servers
            return hook(self, rollout_config, is_eval=True, lora_path=lora_path)
        if lora_path is not None:
            raise BadInput("the farm's engine does not serve LoRA adapters: unset "
                           "actor.use_lora")
        engine = make_engine(rollout_config)
        engine.initialize()
        return engine

    return type(f"Farm{trainer_cls.__name__}", (trainer_cls,),
                {"_init_rollout": _init_rollout, "__module__": __name__,
                 "__doc__": f"{trainer_cls.__qualname__} with the farm's rollout."})
