"""Real SGLang servers on this machine's CPU for the real-engine tier (``pytest -m sglang``).

SGLang lives in a venv of its own, never the project's: ``QUEUE_ROLLOUT_SGLANG_PYTHON``
names its Python (default: ``~/.cache/queue-rollout/sglang-<version>/bin/python``, where
``.ci/run`` installs it). The models are made once by ``make_model.py`` in that venv and
kept under ``~/.cache/queue-rollout/models``. Each server gets the ``sgl_kernel`` stand-in
first on its ``PYTHONPATH`` and a file to record any call of it in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.launch.node import CPU_SGLANG_ARGS, FIND_PACKAGE, SGLANG_PYTHON_ENV
from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import spawn

SGLANG_VERSION = "0.5.23"
AREAL_VERSION = "1.0.4"  # AReaL's API modules, in a venv of their own (.ci/run)
AREAL_PYTHON_ENV = "QUEUE_ROLLOUT_AREAL_PYTHON"
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("QUEUE_ROLLOUT_CACHE", Path.home() / ".cache" / "queue-rollout"))
STAND_IN = HERE / "stand_in"
STAND_IN_LOG_ENV = "QUEUE_ROLLOUT_STAND_IN_LOG"  # not SGL_*: SGLang warns of those
INSTALL_HINT = (
    f"no SGLang: install it in a venv of its own (python3 -m venv "
    f"{CACHE}/sglang-{SGLANG_VERSION} && {CACHE}/sglang-{SGLANG_VERSION}/bin/pip install "
    f"sglang=={SGLANG_VERSION}) or name its Python in {SGLANG_PYTHON_ENV}")
#: The launch arguments of a CPU server (``--sleep-on-idle`` among them: an idle
#: scheduler otherwise holds a whole core, which on a 2-core machine halves every other
#: server's speed), with metrics.
CPU_ARGS = [*CPU_SGLANG_ARGS, "--enable-metrics"]


def find_python(env: str, venv: str, probe: str, *args: str) -> str | None:
    """The Python the environment variable *env* names, else the one of the venv
    ``.ci/run`` makes in the cache (*venv*), when it runs *probe* (with *args*); None
    otherwise."""
    python = os.environ.get(env) or str(CACHE / venv / "bin" / "python")
    if not Path(python).exists():
        return None
    found = subprocess.run([python, "-c", probe, *args], capture_output=True)
    return python if found.returncode == 0 else None


def find_sglang_python() -> str | None:
    """The Python that has SGLang, or None when there is none."""
    return find_python(SGLANG_PYTHON_ENV, f"sglang-{SGLANG_VERSION}", FIND_PACKAGE, "sglang")


def find_areal_python() -> str | None:
    """The Python that has AReaL's API modules and this checkout's package, or None."""
    return find_python(AREAL_PYTHON_ENV, f"areal-{AREAL_VERSION}",
                       "import areal.api.engine_api, queue_rollout")


def model(python: str, seed: int, max_positions: int = 4096, vocab: int = 0) -> Path:
    """The tiny model of *seed* (made once, kept in the cache); *vocab*: rows of its
    embedding where more than its tokenizer's 2048 (the simulated replica's ids)."""
    out = CACHE / "models" / (f"qwen2-tiny-s{seed}-p{max_positions}"
                              + (f"-v{vocab}" if vocab else ""))
    if not (out / "DONE").exists():
        subprocess.run([python, str(HERE / "make_model.py"), str(out), "--seed", str(seed),
                        "--max-positions", str(max_positions),
                        *(["--vocab", str(vocab)] if vocab else [])], check=True,
                       capture_output=True)
    return out


class RealServer:
    """``python -m sglang.launch_server`` on the CPU with *model_path*, on a free port."""

    def __init__(self, python: str, model_path: Path, workdir: Path, *,
                 max_total_tokens: int = 65536, max_running: int = 32,
                 other_weights: Path | None = None) -> None:
        self.model_path, self.other_weights = model_path, other_weights  # for updates
        self.port, self.url = 0, ""  # chosen at each start
        self.stand_in_log = workdir / "sgl_kernel_calls.jsonl"
        self.log_path = workdir / "sglang.log"
        self.python = python
        self.args = ["--max-total-tokens", str(max_total_tokens),
                     "--max-running-requests", str(max_running), *CPU_ARGS]
        # one OpenMP thread: two servers' torch thread pools on 2 cores otherwise spin
        # against each other (8 requests ran at 73 tokens/s here instead of ~400)
        self.env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join(
                        [str(STAND_IN), *filter(None, [os.environ.get("PYTHONPATH")])]),
                    STAND_IN_LOG_ENV: str(self.stand_in_log)}
        self.proc: subprocess.Popen[bytes] | None = None
        self.reference: list[int] | None = None  # a greedy output a test took, to compare

    def start(self, timeout: float = 300.0, tries: int = 3) -> None:
        """Start on a free port and wait until ``/health`` answers. A port taken between
        choosing it and the server's bind (SGLang takes ports of its own meanwhile)
        leaves a server whose HTTP side gave up: it is stopped and started again on
        another port."""
        for _ in range(tries):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            if self._start_once(timeout):
                return
        raise RuntimeError(f"no free port held for the SGLang server in {tries} tries")

    def _start_once(self, timeout: float) -> bool:
        """True once healthy; False when the port was taken; raises on anything else."""
        argv = [self.python, "-m", "sglang.launch_server", "--model-path",
                str(self.model_path), "--host", "127.0.0.1", "--port", str(self.port),
                *self.args]
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            # its own process group: stop() ends the scheduler and detokenizer with it
            self.proc = spawn(argv, env=self.env, stdout=log, stderr=log,
                              start_new_session=True)
        client = SGLangClient(self.url, timeout=5)
        deadline = time.monotonic() + timeout
        while not client.healthy(timeout=5):
            with self.log_path.open("rb") as log:
                log.seek(start)
                said = log.read().decode(errors="replace")
            if "address already in use" in said:
                self.stop()
                return False
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the SGLang server did not become healthy:\n"
                                   + "\n".join(said.splitlines()[-20:]))
            time.sleep(1.0)
        return True

    @contextlib.contextmanager
    def serving(self) -> Iterator[RealServer]:
        """Started, then stopped; the ``sgl_kernel`` stand-in must not have been called
        meanwhile."""
        self.start()
        try:
            yield self
        finally:
            self.stop()
        assert not self.stand_in_calls(), \
            f"the sgl_kernel stand-in was called: {self.stand_in_calls()}"

    def stand_in_calls(self) -> list[str]:
        """Every call of the ``sgl_kernel`` stand-in recorded so far (one JSON line each)."""
        if not self.stand_in_log.exists():
            return []
        return self.stand_in_log.read_text().splitlines()

    def stop(self) -> None:
        """SIGTERM to the server's whole process group, SIGKILL to what is left after
        30 s (a server whose HTTP side failed to bind ignores SIGTERM)."""
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to *proc*'s process group (it leads one), SIGKILL to what is left after
    30 s; waits for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


if __name__ == "__main__":  # a server by hand: python server.py SEED
    found = find_sglang_python()
    if found is None:
        sys.exit(INSTALL_HINT)
    server = RealServer(found, model(found, int(sys.argv[1]) if len(sys.argv) > 1 else 0),
                        Path.cwd())
    server.start()
    print(server.url, flush=True)
    try:
        if server.proc is not None:
            server.proc.wait()
    finally:
        server.stop()
