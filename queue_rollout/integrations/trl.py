"""TRL's ``GRPOTrainer`` with its rollouts drawn from a queue-rollout farm.

    from queue_rollout import RolloutClient
    from queue_rollout.integrations.trl import FarmRollout

    farm = FarmRollout(RolloutClient.from_config("farm.toml"), checkpoints="ckpt")
    trainer = GRPOTrainer(model=model, reward_funcs=[...], train_dataset=dataset,
                          args=GRPOConfig(num_generations=G, per_device_train_batch_size=B * G,
                                          ...),
                          rollout_func=farm, callbacks=[farm.callback()])

Each generation TRL asks for completions of its prompts (each repeated
``num_generations`` times, in order). :class:`FarmRollout` submits them as groups of
``rollout.group_size``, waits for exactly those groups (:meth:`RolloutClient.get_groups`)
and returns them in TRL's order: the prompt's token ids, the produced tokens, their
logprobs. After each optimizer step the callback acknowledges the step's groups, saves
the policy to ``CHECKPOINTS/vNNNNNN``, and every replica loads it
(:meth:`RolloutClient.update_weights`) as the next policy version.

TRL's loop is synchronous: it asks for one generation batch, which must be exactly one
batch of the farm (``rollout.batch_size`` groups), and waits for it whole. Sample-level
refill can help only inside that wait (a freed slot takes a member of the same batch);
nothing is generated while TRL trains. Rewards are TRL's (its ``reward_funcs``, on the
trainer); the farm's acceptance rules judge the farm workflow's rewards, which TRL does
not train on, so a farm with ``acceptance`` rules on rewards is refused. The farm
workflow's reward, each token's policy version and the row's group and member
(``"GROUP/MEMBER"``) reach the reward functions as the keyword arguments
``farm_reward``, ``farm_versions`` and ``farm_group``.

Needs ``trl >= 1.0`` (``pip install 'queue-rollout[trl]'``): the release from which
``rollout_func(prompts, trainer)`` is called without vLLM.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from queue_rollout.client.rollout import Batch, RolloutClient
from queue_rollout.errors import BadInput

log = logging.getLogger(__name__)

#: TRL's prompt (a text, or a conversation: a list of messages) and the trainer ->
#: the farm prompt's fields but ``id``: ``input_ids`` and what the farm's workflow needs
PromptFields = Callable[[Any, Any], dict[str, Any]]
#: how often the rollout function polls for its batch (TRL waits on nothing else)
POLL_S = 0.05


def tokenized(prompt: Any, trainer: Any) -> dict[str, Any]:
    """The default :data:`PromptFields`: the prompt's token ids, as TRL makes them (the
    trainer's ``processing_class``; a conversation through its chat template)."""
    tokenizer = trainer.processing_class
    if isinstance(prompt, str):
        return {"input_ids": list(tokenizer(text=[prompt])["input_ids"][0])}
    chat = tokenizer.apply_chat_template(
        conversation=[prompt], chat_template=getattr(trainer, "chat_template", None),
        add_generation_prompt=True, tokenize=True, return_dict=True,
        **(getattr(trainer, "chat_template_kwargs", None) or {}))
    return {"input_ids": list(chat["input_ids"][0])}


class FarmRollout:
    """TRL's ``rollout_func`` on a farm, and (:meth:`callback`) the weight push after each
    optimizer step. ``steps`` records each generation and each push: the groups, the
    policy version, the seconds waited for the batch, saving and loading the weights."""

    def __init__(self, client: RolloutClient, checkpoints: str | Path, *,
                 prompt_fields: PromptFields = tokenized, run_id: str | None = None,
                 timeout: float | None = 600.0) -> None:
        acceptance = client.config.acceptance
        if acceptance.reject_zero_variance or acceptance.plugin:
            raise BadInput("the farm's acceptance rules (acceptance.reject_zero_variance, "
                           "acceptance.plugin) judge the farm workflow's rewards, but TRL "
                           "trains on its own reward_funcs: unset them for a TRL trainer")
        if acceptance.max_failed_members:
            raise BadInput("acceptance.max_failed_members must be 0 for a TRL trainer: "
                           "TRL cannot train on a member that produced nothing")
        self.client = client
        self.checkpoints = Path(checkpoints)
        self.prompt_fields = prompt_fields
        #: the prefix of this run's group ids (the farm refuses an id it knows)
        self.run_id = run_id or f"trl-{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self.steps: list[dict[str, Any]] = []
        self._calls = 0
        self._unacked: Batch | None = None

    # -- rollout_func ------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        rollout = self.client.config.rollout
        g, b = rollout.group_size, rollout.batch_size
        self._check(trainer, prompts)
        if self._unacked is not None:  # generation again before an optimizer step
            raise BadInput("TRL asked for a new generation before the callback "
                           "acknowledged the last one: pass callbacks=[farm.callback()]")
        unique = prompts[::g]
        ids = [f"{self.run_id}-{self._calls:06d}-{j:03d}" for j in range(b)]
        self._calls += 1
        self.client.submit([{**self.prompt_fields(p, trainer), "id": gid}
                            for p, gid in zip(unique, ids, strict=True)])
        started = time.monotonic()
        batch = self.client.get_groups(ids, timeout=self.timeout, max_poll_s=POLL_S)
        waited = time.monotonic() - started
        version = self.client.version()
        view = batch.training_view(version, rollout.max_staleness)
        self._unacked = batch
        out: dict[str, list[Any]] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "farm_group",
            "farm_reward", "farm_versions")}
        for s in view.samples:
            p = s.prompt_len
            if not s.input_ids[p:]:
                raise BadInput(f"group {s.group!r} member {s.member}: no tokens "
                               f"({s.finish_reason}); TRL needs at least one per completion")
            out["prompt_ids"].append(s.input_ids[:p])
            out["completion_ids"].append(s.input_ids[p:])
            out["logprobs"].append(s.logprobs[p:])
            # TRL trains where env_mask is 1: the policy's tokens inside the window
            out["env_mask"].append([m & (1 - st) for m, st in zip(s.loss_mask[p:],
                                                                    s.stale_mask[p:],
                                                                    strict=True)])
            out["farm_group"].append(f"{s.group}/{s.member}")
            out["farm_reward"].append(s.reward)
            out["farm_versions"].append(s.versions[p:])
        self.steps.append({"generation": self._calls, "batch": batch.id, "groups": ids,
                           "version": version, "wait_s": waited,
                           "produced": sum(map(sum, out["env_mask"])),
                           "token_versions": sorted({v for vs in out["farm_versions"]
                                                     for v in vs if v >= 0})})
        return out

    def _check(self, trainer: Any, prompts: Sequence[Any]) -> None:
        config = self.client.config
        g, b = config.rollout.group_size, config.rollout.batch_size
        temperature = config.workflow.sampling.temperature
        if not trainer.model.training:
            raise BadInput("evaluation through the farm is not supported: evaluate "
                           "outside the trainer, or set eval_strategy='no'")
        if trainer.accelerator.num_processes != 1:
            raise BadInput("a TRL trainer on a farm runs as one process (found "
                           f"{trainer.accelerator.num_processes})")
        if trainer.num_generations != g:
            raise BadInput(f"num_generations = {trainer.num_generations}, but the farm's "
                           f"groups are rollout.group_size = {g}: make them equal")
        if getattr(trainer, "temperature", temperature) != temperature:
            raise BadInput(f"TRL's temperature {trainer.temperature} is not the farm's "
                           f"(workflow.sampling.temperature = {temperature}): TRL scores the "
                           "tokens at its own, so make them equal")
        if len(prompts) != g * b:
            raise BadInput(f"TRL asked for {len(prompts)} completions at once; the farm "
                           f"delivers batches of rollout.batch_size = {b} groups of {g}: "
                           f"make the generation batch (per_device_train_batch_size x "
                           f"steps_per_generation) {g * b}")
        for i, p in enumerate(prompts):
            if p != prompts[i - i % g]:
                raise BadInput(f"completion {i}'s prompt differs from its group's first: "
                               "TRL's prompts come num_generations at a time")

    # -- the weight push -----------------------------------------------------------------

    def publish(self, model: Any, processing_class: Any = None) -> str:
        """After an optimizer step: acknowledge the last generation's groups, save the
        policy as the next version, have every replica load it. Returns its folder."""
        row: dict[str, Any] = {}
        if self._unacked is not None:
            self.client.ack(self._unacked)
            row["acked"] = self._unacked.id
            self._unacked = None
        version = self.client.version() + 1
        path = self.checkpoints / f"v{version:06d}"
        t0 = time.monotonic()
        model.save_pretrained(path, safe_serialization=True)
        if processing_class is not None:
            processing_class.save_pretrained(path)
        t1 = time.monotonic()
        self.client.update_weights(str(path), version)  # pause, load, set version, resume
        row.update(pushed=version, path=str(path), save_s=t1 - t0,
                   update_s=time.monotonic() - t1)
        if self.steps and "pushed" not in self.steps[-1]:
            self.steps[-1].update(row)
        else:
            self.steps.append(row)
        log.info("v%d loaded by every replica (%s)", version, path)
        return str(path)

    def callback(self) -> Any:
        """The TRL (transformers) callback that calls :meth:`publish` after each
        optimizer step."""
        from transformers import TrainerCallback

        farm = self

        class PushWeights(TrainerCallback):  # type: ignore[misc]  # no type stubs
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                            processing_class: Any = None, **kwargs: Any) -> None:
                farm.publish(model, processing_class)

        return PushWeights()
