"""Config decoding: every refusal names the key."""

from __future__ import annotations

import datetime
import math
import re
import typing

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from queue_rollout.config import Config, decode_config, load_config, to_toml
from queue_rollout.errors import ConfigError
from testkit import examples


def test_defaults_are_the_design_defaults():
    c = load_config(None)
    assert c == Config()
    assert (c.rollout.group_size, c.rollout.batch_size) == (8, 16)
    assert c.rollout.mode == "group" and c.rollout.capacity_slots() == 128
    assert c.metrics.host == "127.0.0.1"
    assert c.farm.redis_url == ""


def test_full_design_file_decodes(tmp_path, monkeypatch):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "rules.py").write_text("def accept(group):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
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
    auto = decode_config('[rollout]\nmax_concurrent_samples = "auto"\n')
    assert auto.rollout.capacity_slots(40) == 40
    assert decode_config("[rollout]\nmax_concurrent_samples = 48\n").rollout.capacity_slots() == 48
    with pytest.raises(ConfigError, match="auto"):
        decode_config('[rollout]\nmax_concurrent_samples = "auto"\n').rollout.capacity_slots()


@pytest.mark.parametrize("section,key,value", [
    ("rollout", "group_size", "0"),
    ("rollout", "group_size", "1025"),  # admitting a group creates G attempts in one step
    ("rollout", "batch_size", "-3"),
    ("rollout", "max_concurrent_rollouts", "true"),
    ("rollout", "max_attempts", "2.0"),
    ("rollout", "max_staleness", "-1"),
    ("rollout", "placement", '"replica"'),
    ("rollout", "placement", "true"),
    ("rollout", "placement_wait_s", "-1"),
    ("rollout", "placement_wait_s", '"10"'),
    ("acceptance", "max_failed_members", "-1"),
    ("workflow", "seed", "-1"),
    ("engine", "replicas", "0"),
    ("engine", "slots_per_replica", '"16"'),
    ("engine", "base_port", "70000"),
    ("engine", "prefill_tokens_per_s", "0"),
    ("engine", "chunked_prefill_size", "-1"),
    ("engine", "max_total_tokens", "0"),
    ("engine", "max_total_tokens", "4096"),  # smaller than one chunk (8,192)
    ("engine", "pause_mode", '"sleep"'),
    ("engine", "adaptive_slots", '"yes"'),
    ("engine", "min_slots_per_replica", "0"),
    ("engine", "min_slots_per_replica", "17"),  # above slots_per_replica (16)
    ("engine", "adaptive_interval_s", "0"),
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


@pytest.mark.parametrize("section,ref,message", [
    ("workflow", "name = \"nope\"", "workflow.name: 'nope' is neither a built-in "
                                    "(controlled_length, controlled_turns, generate, math, "
                                    "noop) nor package.module:factory"),
    ("workflow", "name = \"no_such_module_here:factory\"",
     "workflow.name: cannot load 'no_such_module_here:factory': ModuleNotFoundError"),
    ("workflow", "name = \"json:no_such_name\"", "workflow.name: cannot load "
                                                 "'json:no_such_name': AttributeError"),
    ("workflow", "name = \"json:__doc__\"", "workflow.name: 'json:__doc__' is not callable"),
    ("acceptance", "plugin = \"no_such_module_here:rule\"",
     "acceptance.plugin: cannot load 'no_such_module_here:rule': ModuleNotFoundError"),
])
def test_workflows_and_plugins_that_cannot_be_loaded_are_refused_with_the_config(
        section, ref, message):
    with pytest.raises(ConfigError) as exc:
        decode_config(f"[{section}]\n{ref}\n", "farm.toml")
    assert str(exc.value).startswith(f"farm.toml: {message}"), str(exc.value)


def test_loadable_plugins_and_every_built_in_workflow_are_accepted():
    from queue_rollout.config import BUILT_IN_WORKFLOWS
    from queue_rollout.workers.workflows import BUILT_IN

    assert set(BUILT_IN) == set(BUILT_IN_WORKFLOWS)  # the config knows the workers' names
    for name in BUILT_IN_WORKFLOWS:
        assert decode_config(f'[workflow]\nname = "{name}"\n').workflow.name == name
    c = decode_config('[workflow]\nname = "json:loads"\n[acceptance]\nplugin = "json:dumps"\n')
    assert (c.workflow.name, c.acceptance.plugin) == ("json:loads", "json:dumps")


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


def test_written_configs_are_private_to_their_owner(tmp_path):
    """up and node write the farm's config (with the Redis password) for their
    children: mode 0600, even over a file that was readable by others."""
    from queue_rollout.config import load_config, write_config

    config = decode_config('[farm]\nredis_url = "redis://u:secret@h:1/0"\n')
    path = tmp_path / "up.toml"
    path.write_text("old")
    path.chmod(0o644)
    write_config(path, config)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_config(path) == config


def test_unknown_keys_name_the_whole_path_and_a_near_miss():
    with pytest.raises(ConfigError) as info:
        decode_config("[rollout]\ngrup_size = 4\n", source="farm.toml")
    assert str(info.value) == "farm.toml: rollout.grup_size: unknown key (did you mean group_size?)"
    with pytest.raises(ConfigError,
                       match=r"^config: workflow\.sampling\.sampling_seed: unknown key$"):
        decode_config("[workflow.sampling]\nsampling_seed = 4\n")
    with pytest.raises(ConfigError,
                       match=r"^config: rolout: unknown key \(did you mean rollout\?\)$"):
        decode_config("[rolout]\ngroup_size = 4\n")


@pytest.mark.parametrize("data,message", [
    (b'[farm]\nname = "caf\xe9"\n', "config:2: not UTF-8 text"),
    ("[rollout]\ngroup_size = " + "1" * 5000 + "\n",
     "config: not valid TOML: a number has too many digits"),
    ("x = " + "[" * 5000, "config: not valid TOML: nested too deeply"),
])
def test_unreadable_toml_is_a_config_error(data, message):
    with pytest.raises(ConfigError) as info:
        decode_config(data)
    assert str(info.value).startswith(message)


# -- fuzzing the decoder: a Config or a ConfigError naming a key, nothing else -----------

FUZZ = settings(max_examples=examples(200), derandomize=True)
def table_struct(kind: object) -> type:
    """The struct of a table, or of an array of tables (``list[CellConfig]``)."""
    return typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind  # type: ignore[return-value]


SECTIONS = {name: list(table_struct(typing.get_type_hints(Config)[name]).__struct_fields__)
            for name in Config.__struct_fields__}
FIELDS = sorted({f for fields in SECTIONS.values() for f in fields} | {"sampling"})
junk_keys = st.from_regex(r"[a-z_]{1,6}", fullmatch=True)
scalars = st.one_of(
    st.integers(-2, 70_000), st.integers(), st.booleans(), st.floats(),
    st.text(max_size=8), st.dates(),
    st.sampled_from(["auto", "sim", "sglang", "abort", "in_place", "m.x:f", "demo", ""]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(FIELDS) | junk_keys, inner, max_size=3),
                      max_leaves=6)
tables = st.dictionaries(st.sampled_from(FIELDS) | junk_keys, values, max_size=4)


def section(struct: type) -> st.SearchStrategy[dict]:
    """A table of *struct*'s own keys, each its default or anything (an array of
    tables: a few such tables)."""
    defaults = {f.name: (f.default if f.default_factory is msgspec.NODEFAULT
                         else f.default_factory()) for f in msgspec.structs.fields(struct)}
    fields: dict[str, st.SearchStrategy] = {}
    for name, kind in typing.get_type_hints(struct).items():
        value = defaults[name]
        if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            fields[name] = section(kind)
        elif typing.get_origin(kind) is list and issubclass(table_struct(kind), msgspec.Struct):
            fields[name] = st.lists(section(table_struct(kind)), max_size=3)
        elif value is None or value is msgspec.NODEFAULT:
            fields[name] = scalars | values
        else:
            fields[name] = st.one_of(st.just(value), st.just(value), scalars, values)
    return st.fixed_dictionaries({}, optional=fields)


def stray(doc: dict, where: str, key: str, value: object) -> dict:
    """*doc* with one unknown *key* in table *where* (at the top when it has none)."""
    if isinstance(doc.get(where), dict):
        return {**doc, where: {**doc[where], key: value}}
    return {**doc, key: value}


own = section(Config)
documents = st.one_of(
    own, own, own, st.builds(stray, own, st.sampled_from(list(SECTIONS)), junk_keys, values),
    st.dictionaries(st.sampled_from(list(SECTIONS)) | junk_keys, tables | values, max_size=4))


def toml_str(s: str) -> str:
    return '"' + "".join(c if c >= " " and c not in '"\\\x7f' else f"\\u{ord(c):04x}"
                         for c in s) + '"'


def toml_inline(v: object) -> str:
    """A TOML literal, written here independently of config.to_toml."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, (int, datetime.date)):
        return str(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_inline(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{toml_str(k)} = {toml_inline(x)}" for k, x in v.items()) + "}"


def key_paths(d: object, prefix: str = "") -> set[str]:
    out: set[str] = set()
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        out |= {prefix + str(k)} | key_paths(v, f"{prefix}{k}.")
    return out


@FUZZ
@given(documents)
@example({"rollout": {"group_size": 10, "max_concurrent_samples": 4}})
@example({"workflow": {"sampling": {"stop": ["\x7f\U0001F600"], "temperature": math.inf}}})
@example({"farm": {"redis_url": "redis://h/0\x7f", "name": "a"}})
def test_config_fuzz_documents_decode_or_name_a_key_they_hold(doc):
    text = "\n".join(f"{toml_str(k)} = {toml_inline(v)}" for k, v in doc.items()) + "\n"
    try:
        config = decode_config(text)
    except ConfigError as exc:
        m = re.match(r"config: ([\w.]+): ", str(exc))
        assert m and m.group(1) in key_paths(doc), str(exc)
        return
    assert isinstance(config, Config)
    again = to_toml(config)  # and to_toml writes TOML that decodes back to the same config
    assert to_toml(decode_config(again)) == again


toml_fragments = st.sampled_from([
    "[rollout]", "[farm]", "[workflow.sampling]", "[[engine]]", "\n", " = ", "=", ".", ",",
    "group_size", "max_concurrent_samples", "name", "urls", "x", '"', "'", '"""', "[", "]",
    "{", "}", "1", "-1", "0x1f", "1e999", "nan", "true", "1979-05-27", '"auto"', "\\u0000",
    "#", "\t", "\r\n", "\x7f", "\U0001F600"])


@FUZZ
@given(st.lists(toml_fragments, max_size=14).map("".join) | st.text(max_size=30)
       | st.binary(max_size=30))
def test_config_fuzz_text_decodes_or_is_a_config_error(data):
    try:
        config = decode_config(data)
    except ConfigError as exc:
        assert re.match(r"config(:\d+)?: (not valid TOML: |not UTF-8 text|[^:]+: )", str(exc))
        return
    assert isinstance(config, Config)


@pytest.mark.parametrize(("toml", "said"), [
    ('[rollout]\nmax_concurrent_samples = "Auto"\n',
     "rollout.max_concurrent_samples: Invalid enum value 'Auto' (it takes an integer > 0 "
     'or "auto")'),
    ('[rollout]\nplacement = "Group"\n',
     "rollout.placement: Invalid enum value 'Group' (it takes \"any\" or \"group\")"),
    ("[workflow]\ntemperature = 0.5\n",
     "workflow.temperature: unknown key (did you mean workflow.sampling.temperature?)"),
])
def test_a_word_a_key_does_not_take_names_those_it_does_and_a_key_a_table_too_high_its_place(
        toml, said):
    with pytest.raises(ConfigError) as refused:
        decode_config(toml, "farm.toml")
    assert str(refused.value) == f"farm.toml: {said}"


CELLS = ('[farm]\nredis_url = "redis://control:6379/0"\n'
         '[[cells]]\nname = "a"\nredis_url = "redis://a:6379/0"\n'
         '[[cells]]\nname = "b"\nredis_url = "redis://b:6379/0"\nweight = 3.0\n')


def test_a_farm_of_cells_and_what_each_cell_sees():
    config = decode_config(CELLS + '[rollout]\ngroup_size = 4\nmax_concurrent_samples = 64\n')
    assert config.cell_weights() == {"a": 1.0, "b": 3.0}
    a, b = config.for_cell("a"), config.for_cell("b")
    assert (a.farm.redis_url, b.farm.redis_url) == ("redis://a:6379/0", "redis://b:6379/0")
    assert (a.rollout.max_concurrent_samples, b.rollout.max_concurrent_samples) == (16, 48)
    assert a.cells == [] and a.farm.name == config.farm.name
    assert decode_config(to_toml(config)) == config
    grouped = decode_config(CELLS + "[rollout]\nmax_concurrent_rollouts = 10\n")
    assert [grouped.for_cell(n).rollout.max_concurrent_rollouts for n in "ab"] == [2, 7]
    with pytest.raises(ConfigError, match=r"no cell 'c'.*a, b"):
        config.for_cell("c")


def test_each_cell_has_a_folder_of_its_own_where_up_keeps_a_redis_without_a_url():
    config = decode_config('[farm]\nstate_dir = "/s"\n[[cells]]\nname = "a"\n'
                           '[[cells]]\nname = "b"\nredis_url = "redis://b:6379/0"\n')
    a, b = config.for_cell("a"), config.for_cell("b")
    assert (a.farm.redis_url, a.farm.state_dir) == ("", "/s/cells/a")
    assert (b.farm.redis_url, b.farm.state_dir) == ("redis://b:6379/0", "/s/cells/b")
    assert config.farm.redis_url == "" and decode_config(to_toml(config)) == config


@pytest.mark.parametrize(("toml", "said"), [
    (CELLS.replace('"b"', '"a"'), "cells: a cell named twice: a"),
    (CELLS + "[rollout]\ngroup_size = 8\nmax_concurrent_samples = 16\n",
     "rollout.max_concurrent_samples: cell a's share (weight 1) is 4 slots"),
    (CELLS.replace('name = "a"\n', ""), "cells.0: Object missing required field `name`"),
    (CELLS + "[rollout]\nmax_concurrent_rollouts = 3\n",
     "cells: cell a's share (weight 1) of rollout.max_concurrent_rollouts = 3 groups is none"),
])
def test_a_farm_of_cells_refused_says_why(toml, said):
    with pytest.raises(ConfigError, match=re.escape(f"config: {said}")):
        decode_config(toml)
