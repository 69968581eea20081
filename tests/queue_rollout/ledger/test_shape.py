"""A process whose config disagrees with the farm's (group size, workflow) is refused
at start, and changes nothing."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from queue_rollout.config import Config
from queue_rollout.errors import ConfigError, SchemaMismatch
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.shape import SCHEMA, check_shape
from queue_rollout.procs import cli_exe
from testkit import farm_config, merged, write_farm


def sections(redis_url: str, **changes: dict) -> dict:
    """Farm s's config: G = 4, B = 2; *changes* change or add keys."""
    return merged({"farm": {"name": "s", "redis_url": redis_url},
                   "rollout": {"group_size": 4, "batch_size": 2}}, changes)


def config(redis_url: str, **changes: dict) -> Config:
    return farm_config(**sections(redis_url, **changes))


def start_worker(path: Path) -> subprocess.CompletedProcess[str]:
    """``queue-rollout worker`` with the config at *path*; no replica listens on its
    engine URL, so a refusal comes before it would wait for one."""
    return subprocess.run([cli_exe(), "worker", "--gpu", "0", "--engine-url",
                           "http://127.0.0.1:9", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_the_first_process_records_the_shape_and_a_match_passes(r, redis_url):
    Ledger.from_config(r, config(redis_url))
    record = json.loads(r.get(Keys("s").shape))
    assert record["schema"] == SCHEMA == 1
    assert record["shape"] == {"rollout.group_size": 4, "workflow.name": "controlled_length",
                               "workflow.seed": 0, "rollout.placement": "any"}
    Ledger.from_config(r, config(redis_url, rollout={"max_staleness": 5}))
    assert json.loads(r.get(Keys("s").shape)) == record  # not rewritten


@pytest.mark.parametrize("changes, message", [
    ({"rollout": {"group_size": 8}},
     "rollout.group_size = 8 here, 4 in the farm"),
    ({"workflow": {"name": "noop"}},
     'workflow.name = "noop" here, "controlled_length" in the farm'),
    ({"workflow": {"seed": 3}},
     "workflow.seed = 3 here, 0 in the farm"),
    ({"rollout": {"placement": "group"}},
     'rollout.placement = "group" here, "any" in the farm'),
])
def test_a_config_that_disagrees_is_refused_and_changes_nothing(r, redis_url, redis_snapshot,
                                                                changes, message):
    Ledger.from_config(r, config(redis_url))
    before = redis_snapshot()
    with pytest.raises(ConfigError) as err:
        check_shape(r, config(redis_url, **changes))
    assert message in str(err.value) and "farm 's' runs another configuration" in str(err.value)
    assert redis_snapshot() == before


def test_a_worker_with_another_group_size_is_refused_at_start(r, redis_url, redis_snapshot,
                                                               tmp_path: Path):
    Ledger.from_config(r, config(redis_url))
    before = redis_snapshot()
    path = tmp_path / "worker.toml"
    write_farm(path, **sections(redis_url, rollout={"group_size": 2}))
    done = start_worker(path)
    assert done.returncode == 2, done.stderr
    assert "rollout.group_size = 2 here, 4 in the farm" in done.stderr
    assert redis_snapshot() == before  # not registered, nothing written


def test_a_farm_recorded_before_placement_joined_the_shape_places_nothing(r, redis_url):
    """A shape record without ``rollout.placement`` (an earlier release wrote it) holds
    the default: a process that places groups is refused, one that does not passes."""
    Ledger.from_config(r, config(redis_url))
    record = json.loads(r.get(Keys("s").shape))
    del record["shape"]["rollout.placement"]
    r.set(Keys("s").shape, json.dumps(record))
    Ledger.from_config(r, config(redis_url))
    refusal = re.escape('rollout.placement = "group" here, "any" in the farm')
    with pytest.raises(ConfigError, match=refusal):
        check_shape(r, config(redis_url, rollout={"placement": "group"}))


def test_a_worker_that_places_otherwise_than_the_farm_is_refused_at_start(
        r, redis_url, redis_snapshot, tmp_path: Path):
    Ledger.from_config(r, config(redis_url, rollout={"placement": "group"}))
    before = redis_snapshot()
    path = tmp_path / "worker.toml"
    write_farm(path, **sections(redis_url))
    done = start_worker(path)
    assert done.returncode == 2, done.stderr
    assert 'rollout.placement = "any" here, "group" in the farm' in done.stderr
    assert redis_snapshot() == before


@pytest.mark.parametrize("argv", [["collector"], ["node", "--gpus", "0"],
                                  ["consume", "--batches", "1", "--timeout", "1"]])
def test_the_collector_node_and_trainer_commands_refuse_another_workflow(
        r, redis_url, redis_snapshot, tmp_path: Path, argv):
    Ledger.from_config(r, config(redis_url))
    before = redis_snapshot()
    path = tmp_path / "other.toml"
    write_farm(path, **sections(redis_url, workflow={"name": "noop"}))
    done = subprocess.run([cli_exe(), *argv, "-c", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert 'workflow.name = "noop" here, "controlled_length" in the farm' in done.stderr
    assert redis_snapshot() == before


def test_a_ledger_of_another_schema_is_refused_and_changes_nothing(r, redis_url, redis_snapshot,
                                                                    tmp_path: Path):
    Ledger.from_config(r, config(redis_url))
    record = json.loads(r.get(Keys("s").shape))
    r.set(Keys("s").shape, json.dumps({**record, "schema": SCHEMA + 1}))
    before = redis_snapshot()
    with pytest.raises(SchemaMismatch) as err:
        Ledger.from_config(r, config(redis_url))
    assert err.value.exit_code == 2
    assert f"keeps its ledger in schema {SCHEMA + 1}" in str(err.value)
    assert "Drain the farm first" in str(err.value)
    path = tmp_path / "worker.toml"
    write_farm(path, **sections(redis_url))
    done = start_worker(path)
    assert done.returncode == 2, done.stderr
    assert f"this queue-rollout reads and writes schema {SCHEMA}" in done.stderr
    doctor = subprocess.run([cli_exe(), "doctor", "--repair", "-c", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 2 and "Drain the farm first" in doctor.stderr, doctor.stderr
    assert redis_snapshot() == before


def test_a_record_without_a_schema_gains_this_one_in_place(r, redis_url):
    """A release before the schema was recorded wrote this layout: a process that
    matches the rest of the record adds the schema, and changes nothing else."""
    Ledger.from_config(r, config(redis_url))
    record = json.loads(r.get(Keys("s").shape))
    old = {k: v for k, v in record.items() if k != "schema"}
    r.set(Keys("s").shape, json.dumps(old))
    with pytest.raises(ConfigError):  # a process that disagrees writes nothing
        Ledger.from_config(r, config(redis_url, rollout={"group_size": 8}))
    assert json.loads(r.get(Keys("s").shape)) == old
    Ledger.from_config(r, config(redis_url))
    assert json.loads(r.get(Keys("s").shape)) == {**old, "schema": SCHEMA}


def test_a_record_that_changed_meanwhile_is_not_rewritten(r, redis_url):
    """The schema is added only to the record as it was read: a record changed since
    (a farm cleared and started again) is whoever changed it's."""
    from queue_rollout.ledger.shape import _add_schema

    key = Keys("s").shape
    r.set(key, json.dumps({"shape": {"rollout.group_size": 2}}))
    _add_schema(r, key, b'{"shape": {"rollout.group_size": 4}}', {"schema": SCHEMA})
    assert json.loads(r.get(key)) == {"shape": {"rollout.group_size": 2}}
