"""AReaL's own rollout on a bench's replicas: its remote SGLang engine and workflow
executor as AReaL 1.0.4 releases them, driven in its trainer's order, over one manifest.

Run in AReaL's venv (``QUEUE_ROLLOUT_AREAL_PYTHON``), not imported by the package::

    python -m queue_rollout.lab.bench.areal_rollout SPEC.json OUT.json

SPEC names the replicas (``addresses``, host:port), the manifest (``prompts``: each an
``id``, ``input_ids`` and ``member_lengths``), the shape (``batch_size``,
``max_concurrent_rollouts`` in groups, ``max_staleness``, ``batches``,
``train_batches``, ``train_s``), the weights folder each version step reloads
(``weights``) and a folder of its own (``workdir``: AReaL's name records).

The engine is configured as a user would: ``consumer_batch_size`` = B,
``max_concurrent_rollouts`` and ``max_head_offpolicyness`` from the shape; batches come
from ``prepare_batch`` over a data loader of the manifest's groups (one task a group:
its workflow sends the G members at once, each with its exact length through
``ignore_eos`` and ``max_new_tokens``). After the manifest, the loader yields fillers:
tasks that hold no replica and return nothing until the run ends (``prepare_batch``
wants an endless loader; they are submitted after every real group, so they take
nothing from them). The trainer's order is PPOTrainer's: generation goes on while it
"trains" for ``train_s``; then ``pause``, the disk weight update (``pause_generation``,
``update_weights_from_disk`` reloading the folder once the trainer has named it,
``continue_generation``), ``set_version``, ``resume``. Batches after the first
``train_batches`` are drained: the version raised, no pause, no training.

OUT holds, per batch, when it was ready and the window generation stood still (seconds
since the prompts were first submitted, on the monotonic clock) and each group's member
lengths and when its workflow returned it; per episode, when its workflow sent it and
when its batch reached the trainer (wall clock); and this process's CPU seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXPERIMENT, TRIAL = "queue-rollout-bench", "peer"


class Loader:
    """The manifest's groups in lists of *batch_size*, then fillers without end: what
    ``prepare_batch`` iterates (it reads ``batch_size``)."""

    def __init__(self, prompts: list[dict[str, Any]], batch_size: int) -> None:
        self.prompts, self.batch_size = prompts, batch_size

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        items = [{**p, "index": i} for i, p in enumerate(self.prompts)]
        for k in range(0, len(items), self.batch_size):
            yield items[k:k + self.batch_size]
        while True:
            yield [{"filler": True}] * self.batch_size


def make_workflow(sent: dict[tuple[str, int], float]) -> Any:
    """The workflow: a group's members at once, each its exact length; a filler waits
    until the run ends and is rejected. *sent*: (group, member) -> wall time sent."""
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.io_struct import ModelRequest
    from areal.api.workflow_api import RolloutWorkflow

    class ExactLengths(RolloutWorkflow):  # type: ignore[misc]
        async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
            if data.get("filler"):
                await asyncio.Event().wait()  # cancelled when the engine is destroyed
                return None

            async def member(m: int, n: int) -> Any:
                sent[(data["id"], m)] = time.time()
                gconfig = GenerationHyperparameters(max_new_tokens=n, ignore_eos=True,
                                                    temperature=1.0)
                return await engine.agenerate(ModelRequest(
                    rid=f"{data['id']}-m{m}", input_ids=list(data["input_ids"]),
                    gconfig=gconfig))

            answers = await asyncio.gather(*(member(m, n) for m, n in
                                             enumerate(data["member_lengths"])))
            return {"group": data["id"], "index": data["index"], "done": time.time(),
                    "lengths": [len(a.output_tokens) for a in answers],
                    "versions": [sorted(set(a.output_versions)) for a in answers]}

    return ExactLengths()


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from areal.api.cli_args import InferenceEngineConfig, NameResolveConfig
    from areal.api.io_struct import WeightUpdateMeta
    from areal.engine.sglang_remote import RemoteSGLangEngine
    from areal.utils import name_resolve, names

    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    name_resolve.reconfigure(NameResolveConfig(type="nfs",
                                               nfs_record_root=str(workdir / "names")))
    trial = f"{TRIAL}-{uuid.uuid4().hex[:8]}"
    config = InferenceEngineConfig(
        experiment_name=EXPERIMENT, trial_name=trial, backend="sglang:d1",
        consumer_batch_size=spec["batch_size"],
        max_concurrent_rollouts=spec["max_concurrent_rollouts"],
        max_head_offpolicyness=spec["max_staleness"], setup_timeout=120.0,
        request_timeout=600.0)
    engine = RemoteSGLangEngine(config)
    engine.initialize(addr=list(spec["addresses"]), train_data_parallel_size=1)
    sent: dict[tuple[str, int], float] = {}
    workflow = make_workflow(sent)
    loader = Loader(spec["prompts"], spec["batch_size"])
    batches: list[dict[str, Any]] = []
    delivered: dict[str, float] = {}  # group -> wall time its batch reached the trainer
    cpu0 = cpu_seconds()
    t0 = time.monotonic()
    try:
        for k in range(spec["batches"]):
            rows = engine.prepare_batch(loader, workflow=workflow)
            ready, wall = time.monotonic() - t0, time.time()
            for row in rows:
                delivered[row["group"]] = wall
            entry: dict[str, Any] = {"index": k, "ready": ready, "groups": rows}
            version = engine.get_version()
            if k < spec["train_batches"]:
                time.sleep(spec["train_s"])  # "training": generation goes on
                entry["paused"] = time.monotonic() - t0
                engine.pause()
                engine.pause_generation()
                future = engine.update_weights_from_disk(WeightUpdateMeta(
                    type="disk", path=spec["weights"], clear_checkpoint_after_load=False))
                name_resolve.add(names.update_weights_from_disk(EXPERIMENT, trial, version),
                                 str(time.time()), keepalive_ttl=120)
                future.result()
                engine.continue_generation()
                engine.set_version(version + 1)
                engine.resume()
                entry["resumed"] = time.monotonic() - t0
            else:
                engine.set_version(version + 1)
            batches.append(entry)
        seconds = time.monotonic() - t0
        cpu = cpu_seconds() - cpu0
    finally:
        engine.destroy()
    return {"started_at": t0, "batches": batches, "seconds": seconds, "cpu_s": cpu,
            "episodes": [{"group": g, "member": m, "sent": at, "delivered": delivered.get(g)}
                         for (g, m), at in sorted(sent.items())]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m queue_rollout.lab.bench.areal_rollout SPEC.json OUT.json",
              file=sys.stderr)
        return 2
    result = run(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
