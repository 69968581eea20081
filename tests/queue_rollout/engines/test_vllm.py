"""The vLLM client: what it translates and maps without a server (the fast tier), and
what only vLLM asks, of a real vLLM server on this machine's CPU (``pytest -m vllm``):
a prompt and budget past the model's length, a reload against a freshly started server.
What every engine is asked is in ``test_client.py``."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from queue_rollout.config import PauseMode, SamplingConfig
from queue_rollout.engines.base import EngineError
from queue_rollout.engines.client import engine_client
from queue_rollout.engines.vllm import (
    PAUSE_QUERY,
    SAMPLING_KEYS,
    VLLMClient,
    finish_reason,
    translate,
)
from queue_rollout.errors import BadInput

PROMPT = [5, 6, 7]
GREEDY = {"max_new_tokens": 16, "ignore_eos": True, "temperature": 0.0}


# -- without a server --------------------------------------------------------------------

def test_every_sampling_key_of_the_config_has_a_vllm_name():
    assert set(SamplingConfig.__struct_fields__) <= set(SAMPLING_KEYS)
    assert translate({"max_new_tokens": 8, "min_new_tokens": 2, "no_stop_trim": True,
                      "sampling_seed": 7, "top_k": -1, "stop": None}) == {
        "max_tokens": 8, "min_tokens": 2, "include_stop_str_in_output": True, "seed": 7,
        "top_k": 0, "temperature": 1.0}
    assert translate({})["max_tokens"] == 128  # SGLang's default, not the rest of the context


def test_a_sampling_key_vllm_has_no_equivalent_of_is_refused_naming_it():
    with pytest.raises(BadInput, match="json_schema"):
        translate({"temperature": 1.0, "json_schema": "{}"})


def test_the_pause_modes_that_map_and_finish_reasons_read_as_sglangs():
    assert set(PAUSE_QUERY) == set(typing.get_args(PauseMode)) - {"retract"}
    with pytest.raises(EngineError, match="refused"):  # before anything is sent
        VLLMClient("http://127.0.0.1:1", timeout=1).pause("retract")
    assert finish_reason({"finish_reason": "length"}, 5) == {"type": "length", "length": 5}
    assert finish_reason({"finish_reason": "stop", "stop_reason": 9}, 3) == {
        "type": "stop", "matched": 9}
    assert finish_reason({"finish_reason": "abort"}, 0) == {"type": "abort"}


def test_the_engine_kind_picks_the_client():
    assert isinstance(engine_client("vllm", "http://127.0.0.1:1"), VLLMClient)
    assert not isinstance(engine_client("sglang", "http://127.0.0.1:1"), VLLMClient)
    with pytest.raises(ValueError, match="no client"):
        engine_client("tgi", "http://127.0.0.1:1")


def test_a_weight_update_from_a_folder_without_weights_is_refused_before_it_is_sent(
        tmp_path: Path):
    client = VLLMClient("http://127.0.0.1:1", timeout=1)  # nothing listens: never asked
    with pytest.raises(EngineError, match="not a folder holding"):
        client.update_weights_from_disk(str(tmp_path / "missing"))
    with pytest.raises(EngineError, match="not a folder holding"):
        client.update_weights_from_disk(str(tmp_path))


# -- against a real vLLM server ----------------------------------------------------------

@pytest.fixture
def vllm(real_vllm) -> VLLMClient:
    client = VLLMClient(real_vllm.url, timeout=120)
    client.resume()
    return client


@pytest.mark.vllm
def test_a_prompt_and_budget_past_the_models_length_is_refused_not_cut(vllm):
    limit = vllm.max_model_len()
    with pytest.raises(EngineError, match="longer than the model's context length") as exc:
        vllm.generate("too-long", input_ids=[5] * (limit - 4), timeout=120,
                      sampling_params={"max_new_tokens": 8, "ignore_eos": True})
    assert exc.value.status == 400
    fits = vllm.generate("fits", input_ids=[5] * (limit - 8), timeout=120,
                         sampling_params={"max_new_tokens": 8, "ignore_eos": True})
    assert len(fits.output_ids) == 8


@pytest.mark.vllm
def test_a_weight_update_reloads_resets_the_cache_and_labels_later_tokens(
        vllm, real_vllm, vllm_python, tmp_path):
    """The reload check: after the update the greedy output equals a server started on
    those weights (a reload alone would keep the old weights' cached prefixes)."""
    from real_engine.vllm_server import VLLMServer, untied_model

    prompt = list(range(5, 5 + 300))  # more than one 128-token block: a cached prefix
    before = vllm.generate("w-before", input_ids=prompt, sampling_params=GREEDY, timeout=120)
    fresh = VLLMServer(vllm_python, untied_model(vllm_python, 1), tmp_path)
    fresh.start()
    try:
        expected = VLLMClient(fresh.url, timeout=120).generate(
            "w-fresh", input_ids=prompt, sampling_params=GREEDY, timeout=120)
    finally:
        fresh.stop()
    try:
        vllm.update_weights_from_disk(str(untied_model(vllm_python, 1)), weight_version="7")
        after = vllm.generate("w-after", input_ids=prompt, sampling_params=GREEDY,
                              timeout=120)
        assert after.output_ids == expected.output_ids != before.output_ids
        assert after.weight_version == "7" and after.version_runs(6) == [(7, 16)]
    finally:
        vllm.update_weights_from_disk(str(real_vllm.model_path), weight_version="default")
    again = vllm.generate("w-back", input_ids=prompt, sampling_params=GREEDY, timeout=120)
    assert again.output_ids == before.output_ids


def test_a_vllm_farm_pausing_other_than_abort_is_refused_at_start():
    from queue_rollout.config import decode_config
    from queue_rollout.errors import ConfigError

    text = '[engine]\nkind = "vllm"\nurls = ["http://127.0.0.1:1"]\npause_mode = "{}"\n'
    assert decode_config(text.format("abort")).engine.pause_mode == "abort"
    for mode in ("in_place", "retract"):
        with pytest.raises(ConfigError, match=r"engine\.pause_mode"):
            decode_config(text.format(mode))
