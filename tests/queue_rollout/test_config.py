"""Config decoding: every refusal names the key."""

from __future__ import annotations

import pytest

from queue_rollout.config import Config, decode_config, load_config
from queue_rollout.errors import ConfigError


def test_defaults_are_the_design_defaults():
    c = load_config(None)
    assert c == Config()
    assert (c.rollout.group_size, c.rollout.batch_size) == (8, 16)
    assert c.rollout.mode == "group" and c.rollout.capacity_slots() == 128
    assert c.metrics.host == "127.0.0.1"
    assert c.farm.redis_url == ""


def test_full_design_file_decodes(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text("""
[farm]
name = "prod-1"
redis_url = "rediss://collector:secret@redis.internal:6380/0"
state_dir = "/var/lib/qr"
redis_ca_file = "/etc/qr/ca.pem"
[rollout]
group_size = 8
batch_size = 16
max_concurrent_rollouts = 16
max_concurrent_samples = 128
max_staleness = 2
max_attempts = 3
[timeouts]
lease = 30
doubt = 1800
request = 3600
pause_barrier = 60
leader_lease = 10
shutdown_grace = 30
[acceptance]
reject_zero_variance = true
max_failed_members = 1
plugin = "mypkg.rules:accept"
[workflow]
name = "math"
seed = 7
[workflow.sampling]
temperature = 0.6
top_p = 0.95
top_k = 20
max_new_tokens = 16384
[engine]
kind = "sglang"
urls = ["http://127.0.0.1:30000"]
replicas = 8
slots_per_replica = 16
step_ms = 4.5
step_ms_per_request = 0.2
pause_mode = "abort"
model_path = "/models/qwen"
base_port = 30000
deterministic = true
sglang_args = ["--mem-fraction-static", "0.85"]
[limits]
max_prompt_bytes = 1048576
max_result_bytes = 16777216
[metrics]
host = "0.0.0.0"
port = 9464
""")
    c = load_config(path)
    assert c.rollout.mode == "sample" and c.rollout.capacity_slots() == 128
    assert c.workflow.sampling.top_k == 20 and c.engine.pause_mode == "abort"


@pytest.mark.parametrize("value", ["0", "-1", "true", "1.5", '"48"'])
def test_max_concurrent_samples_rejects_bad_values_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"rollout\.max_concurrent_samples"):
        decode_config(f"[rollout]\nmax_concurrent_samples = {value}\n")


def test_max_concurrent_samples_auto_and_int():
    assert decode_config('[rollout]\nmax_concurrent_samples = "auto"\n').rollout.capacity_slots(40) == 40
    assert decode_config("[rollout]\nmax_concurrent_samples = 48\n").rollout.capacity_slots() == 48
    with pytest.raises(ConfigError, match="auto"):
        decode_config('[rollout]\nmax_concurrent_samples = "auto"\n').rollout.capacity_slots()


@pytest.mark.parametrize("section,key,value", [
    ("rollout", "group_size", "0"),
    ("rollout", "batch_size", "-3"),
    ("rollout", "max_concurrent_rollouts", "true"),
    ("rollout", "max_attempts", "2.0"),
    ("rollout", "max_staleness", "-1"),
    ("acceptance", "max_failed_members", "-1"),
    ("workflow", "seed", "-1"),
    ("engine", "replicas", "0"),
    ("engine", "slots_per_replica", '"16"'),
    ("engine", "base_port", "70000"),
    ("metrics", "port", "0"),
    ("timeouts", "lease", "0"),
    ("timeouts", "doubt", "false"),
    ("timeouts", "pause_barrier", "1.5"),
])
def test_counts_sizes_and_timeouts_are_validated_naming_the_key(section, key, value):
    with pytest.raises(ConfigError, match=rf"{section}\.{key}"):
        decode_config(f"[{section}]\n{key} = {value}\n")


def test_unknown_keys_are_rejected_by_name():
    with pytest.raises(ConfigError, match=r"max_concurent_samples"):
        decode_config("[rollout]\nmax_concurent_samples = 4\n")
    with pytest.raises(ConfigError, match=r"bogus"):
        decode_config("[bogus]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"workflow\.sampling.*sampling_seed|sampling_seed"):
        decode_config("[workflow.sampling]\nsampling_seed = 4\n")


def test_a_sample_limit_smaller_than_a_group_is_refused():
    with pytest.raises(ConfigError, match=r"rollout\.max_concurrent_samples.*group_size"):
        decode_config("[rollout]\ngroup_size = 8\nmax_concurrent_samples = 4\n")


def test_bad_names_and_plugins_are_refused():
    with pytest.raises(ConfigError, match=r"farm\.name"):
        decode_config('[farm]\nname = "a{b}"\n')
    with pytest.raises(ConfigError, match=r"acceptance\.plugin"):
        decode_config('[acceptance]\nplugin = "not a ref"\n')


def test_toml_syntax_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        decode_config("[rollout\n")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")


def test_to_toml_round_trips():
    from queue_rollout.config import to_toml

    config = decode_config('[farm]\nname = "x"\nredis_url = "redis://a:b\\"c@h:1/0"\n'
                           '[rollout]\nmax_concurrent_samples = "auto"\n'
                           '[workflow.sampling]\ntop_k = 20\nstop = ["</s>"]\n'
                           '[engine]\nsglang_args = ["--x", "1"]\n')
    assert decode_config(to_toml(config)) == config
    assert decode_config(to_toml(Config())) == Config()
