"""A farm of cells through the command line: a control Redis and two cells, each its
own redis-server; `queue-rollout collector` leading all cells, a `queue-rollout
worker --cell` in each, and a trainer (RolloutClient) submitting, training, pausing and
raising the version. Every group comes once with its exact lengths, both cells run
groups, and the staleness budget held over the whole farm at every admission;
`submit`, `set-version`, `status`, `trace` and `doctor` take the farm's config."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from queue_rollout import RolloutClient
from queue_rollout.cli.main import main
from queue_rollout.client.rollout import Batch
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port
from queue_rollout.procs import cli_exe, stop_all
from testkit import write_farm

STALENESS = 1
B = 2


def start_redis(tmp_path: Path, name: str, stack: contextlib.ExitStack,
                appendfsync: str = "everysec") -> EmbeddedRedis:
    server = EmbeddedRedis(tmp_path / name, write_url=False, appendfsync=appendfsync)
    server.start()
    stack.callback(server.stop)
    return server


def take(trainer: RolloutClient, lengths: dict[str, list[int]], got: list[str],
         admitted: dict[str, int], *, timeout: float) -> Batch:
    """The next batch; each group's members at their assigned lengths, its id added to
    *got* and its admission version to *admitted*."""
    batch = trainer.get_batch(timeout=timeout)
    for group in batch.groups:
        got.append(group.id)
        assert [len(m.output_ids) for m in group.members] == lengths[group.id]
        admitted[group.id] = group.version
    return batch


def budget_held(admitted: dict[str, int]) -> None:
    """The farm-wide budget at every admission, from the consumed groups' admission
    versions: the version rose by one a batch from 0 and nothing was rejected, so under
    version v at most (max_staleness + v + 1) x B groups were ever admitted."""
    for v in range(max(admitted.values()) + 1):
        under = sum(1 for version in admitted.values() if version <= v)
        assert under <= (STALENESS + v + 1) * B, (v, under, sorted(admitted.items()))


def start_farm(tmp_path: Path, stack: contextlib.ExitStack, toml: Path,
               cells: list[dict[str, str]]) -> list[subprocess.Popen[bytes]]:
    """A simulated replica and a `worker --cell` per cell, and the collector."""
    engines = [stack.enter_context(ThreadedSimEngine(slots=4, step_ms=2.0)) for _ in cells]
    procs = [subprocess.Popen([cli_exe(), "worker", "--cell", c["name"], "--gpu", str(i),
                               "--engine-url", e.url, "-c", str(toml)],
                              stdout=subprocess.DEVNULL)
             for i, (c, e) in enumerate(zip(cells, engines, strict=True))]
    procs.append(subprocess.Popen([cli_exe(), "collector", "-c", str(toml)],
                                  stdout=subprocess.DEVNULL))
    stack.callback(stop_all, procs, 30)
    return procs


@pytest.mark.e2e
def test_a_farm_of_cells_runs_through_the_command_line(tmp_path: Path, capsys) -> None:
    with contextlib.ExitStack() as stack:
        control = start_redis(tmp_path, "control", stack).url
        cells = [{"name": n, "redis_url": start_redis(tmp_path, n, stack).url} for n in "ab"]
        toml = write_farm(
            tmp_path / "farm.toml", farm={"name": "cells", "redis_url": control},
            rollout={"group_size": 2, "batch_size": B, "max_concurrent_samples": 8,
                     "max_staleness": STALENESS},
            engine={"slots_per_replica": 4}, timeouts={"shutdown_grace": 2, "lease": 3},
            metrics={"port": free_port()},
            cells=cells)
        # the commands that do not take a farm of cells yet say so, and node needs its cell
        assert main(["plan", "-c", str(toml)]) == 2
        assert "does not run on a farm of cells" in capsys.readouterr().err
        assert main(["node", "--gpus", "0", "-c", str(toml)]) == 2
        assert "name the one its workers join with --cell" in capsys.readouterr().err

        procs = start_farm(tmp_path, stack, toml, cells)

        trainer = RolloutClient.from_config(toml, consumer="t")
        lengths = {f"g{i}": [3 + i % 5, 11] for i in range(12)}
        prompts = [{"id": gid, "prompt": f"cells {gid}", "member_lengths": ls}
                   for gid, ls in lengths.items()]
        trainer.submit(prompts[:6])  # half by the trainer, half by `submit`
        (tmp_path / "more.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts[6:]))
        assert main(["submit", str(tmp_path / "more.jsonl"), "-c", str(toml)]) == 0
        assert main(["submit", str(tmp_path / "more.jsonl"), "-c", str(toml)]) == 2  # known
        got: list[str] = []
        admitted: dict[str, int] = {}  # group id -> the version it was admitted under
        for step in range(len(lengths) // B):
            batch = take(trainer, lengths, got, admitted, timeout=120)
            if step == 2:  # the pause barrier: every cell's worker paused its replica
                trainer.pause()
                trainer.resume()
            trainer.ack(batch)
            if step % 2:
                trainer.set_version(step + 1)
            else:
                assert main(["set-version", str(step + 1), "-c", str(toml)]) == 0
        assert sorted(got) == sorted(lengths)
        budget_held(admitted)
        ran = {trainer.ledger.group(gid).cell for gid in got}
        assert ran == {"a", "b"}
        for name, cell in trainer.cells.items():
            counters = cell.counters()
            assert counters["consumed"] == sum(trainer.ledger.group(g).cell == name for g in got)
            assert cell.version() == len(lengths) // B
        assert all(p.poll() is None for p in procs), "a farm process died"
        capsys.readouterr()
        assert main(["status", "--json", "-c", str(toml)]) == 0
        status = json.loads(capsys.readouterr().out)
        assert set(status["cells"]) == {"a", "b"} and status["workers"]["alive"] == 2
        assert status["groups"]["consumed"] == 12 and status["version"] == len(lengths) // B
        assert status["capacity"] == sum(c["capacity"] for c in status["cells"].values()) == 8
        assert main(["status", "-c", str(toml)]) == 0
        assert "cell a " in capsys.readouterr().out
        assert main(["trace", got[0], "--json", "-c", str(toml)]) == 0
        story = json.loads(capsys.readouterr().out)
        assert story["cell"] == trainer.ledger.group(got[0]).cell
        assert "acked" in json.dumps(story)
        assert main(["doctor", "-c", str(toml)]) == 0
        said = capsys.readouterr().out
        assert "doctor: cell a: ok" in said and "doctor: control: ok" in said, said
        # a group a cell ran that the control Redis does not know of
        trainer.ledger.client.hdel(trainer.ledger.keys.groups, got[0])
        assert main(["doctor", "-c", str(toml)]) == 1
        assert f"group {got[0]} runs there, but the control Redis has it nowhere" in (
            capsys.readouterr().out)


@pytest.mark.failover
@pytest.mark.parametrize("mode", ["group", "sample"])
def test_a_cells_redis_and_the_control_redis_killed_and_restarted(
        tmp_path: Path, mode: str, capsys) -> None:
    """A control Redis and three cells, each Redis with ``appendfsync always``, a long
    tail of episodes. Mid-run, cell a's redis-server is killed with ``kill -9`` and
    restarted (its AOF replayed), then the control Redis's: the workers, the collector
    and the trainer ride both out; every group comes once with its exact lengths, the
    budget held at every admission, and doctor finds the cells and the control Redis
    agreeing."""
    with contextlib.ExitStack() as stack:
        control = start_redis(tmp_path, "control", stack, "always")
        servers = {n: start_redis(tmp_path, n, stack, "always") for n in "abc"}
        cells = [{"name": n, "redis_url": r.url} for n, r in servers.items()]
        admission = ({"max_concurrent_rollouts": 6} if mode == "group"  # 2 groups a cell
                     else {"max_concurrent_samples": 15})  # 5 slots a cell: refill
        toml = write_farm(
            tmp_path / "farm.toml", farm={"name": "cells", "redis_url": control.url},
            rollout={"group_size": 2, "batch_size": B, "max_staleness": STALENESS,
                     **admission},
            engine={"slots_per_replica": 4}, timeouts={"shutdown_grace": 2, "lease": 3},
            metrics={"port": free_port()},
            cells=cells)
        procs = start_farm(tmp_path, stack, toml, cells)
        trainer = RolloutClient.from_config(toml, consumer="t")
        # a long tail: one group in four has a member eight times as long
        lengths = {f"g{i}": [100, 800 if i % 4 == 3 else 100] for i in range(18)}
        trainer.submit([{"id": gid, "prompt": f"cells {gid}", "member_lengths": ls}
                        for gid, ls in lengths.items()])
        faults = {1: servers["a"], 4: control}  # after these batches
        got: list[str] = []
        admitted: dict[str, int] = {}  # group id -> the version it was admitted under
        for step in range(len(lengths) // B):
            batch = take(trainer, lengths, got, admitted, timeout=180)
            trainer.ack(batch)
            trainer.set_version(step + 1)
            if step in faults:  # episodes run meanwhile: the workers and collector see it
                faults[step].kill()
                time.sleep(1.0)
                faults[step].restart()
        assert sorted(got) == sorted(lengths)  # each once
        budget_held(admitted)
        assert all(p.poll() is None for p in procs), "a farm process died"
        capsys.readouterr()
        assert main(["doctor", "-c", str(toml)]) == 0, capsys.readouterr().out
