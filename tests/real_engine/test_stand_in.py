"""The ``sgl_kernel`` stand-in records every call (the positive control of the
real-engine tier's check that nothing called it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from real_engine.server import STAND_IN, STAND_IN_LOG_ENV


def test_a_call_of_the_stand_in_is_recorded_and_raises(tmp_path):
    log = tmp_path / "calls.jsonl"
    code = ("import sgl_kernel\n"
            "try:\n    sgl_kernel.copy_all_layer_kv_cache_cpu(1, x=2)\n"
            "except NotImplementedError as exc:\n    print(exc)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(STAND_IN),
                              STAND_IN_LOG_ENV: str(log)}, check=True)
    assert "stand-in was called: copy_all_layer_kv_cache_cpu" in run.stdout
    [line] = log.read_text().splitlines()
    assert json.loads(line)["name"] == "copy_all_layer_kv_cache_cpu"
    assert json.loads(line)["pid"] > 0


def test_it_registers_no_torch_ops_and_offers_only_recording_functions():
    import importlib.util

    spec = importlib.util.spec_from_file_location("stand_in", STAND_IN / "sgl_kernel" /
                                                  "__init__.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    offered = [n for n, v in vars(module).items() if callable(v) and n.endswith("_cpu")]
    assert offered and all(getattr(module, n).__name__ == n for n in offered)
    assert "torch" not in vars(module)
