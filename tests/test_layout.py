"""The house: how the checkout installs, which names stay importable across releases,
what the light parts load, and that what ships speaks of the product."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
COMMANDS = ("demo", "up", "collector", "submit", "consume", "pause", "resume", "set-version",
            "status", "doctor", "worker", "node", "sim-engine", "bench")


def fresh_python(code: str, *path: Path) -> str:
    """Run *code* in a new interpreter (isolated mode) with *path* first on sys.path."""
    prelude = "import sys; sys.path[:0] = " + repr([str(p) for p in path]) + "\n"
    out = subprocess.run([sys.executable, "-I", "-c", prelude + code], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def build(kind: str, tmp_path: Path) -> zipfile.ZipFile:
    hatchling = pytest.importorskip("hatchling.build")
    pytest.importorskip("editables")  # hatchling needs it to decide on an editable layout
    out = tmp_path / kind
    out.mkdir()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        name = getattr(hatchling, f"build_{kind}")(str(out))
    finally:
        os.chdir(cwd)
    return zipfile.ZipFile(out / name)


def test_an_editable_install_puts_the_checkout_itself_on_the_path(tmp_path):
    wheel = build("editable", tmp_path)
    [pth] = [n for n in wheel.namelist() if n.endswith(".pth")]
    assert Path(wheel.read(pth).decode().strip()) == ROOT
    # and the checkout, as it is, imports the workers as queue_rollout.workers
    where = fresh_python("import queue_rollout.workers.episode as e; print(e.__file__)", ROOT)
    assert Path(where.strip()) == ROOT / "queue_rollout" / "workers" / "episode.py"
    assert (ROOT / "queue_rollout" / "workers").resolve() == ROOT / "workers"


def test_the_wheel_holds_every_worker_module_and_the_lua_scripts(tmp_path):
    names = set(build("wheel", tmp_path).namelist())
    for py in sorted((ROOT / "workers").glob("*.py")):
        assert f"queue_rollout/workers/{py.name}" in names, py.name
    for lua in sorted((ROOT / "queue_rollout" / "ledger" / "lua").glob("*.lua")):
        assert f"queue_rollout/ledger/lua/{lua.name}" in names, lua.name
    assert {"queue_rollout/py.typed", "queue_rollout/engines/SGLANG_API.md",
            "queue_rollout/lab/plan/redis_load.json"} <= names
    assert not any(n.startswith(("workers/", "tests/")) for n in names)


def test_names_that_outlive_a_release_stay_importable():
    out = fresh_python(
        "from queue_rollout.workers.episode import run_attempt\n"
        "from queue_rollout.ledger.keys import EPISODE_JOB_FUNC\n"
        "import queue_rollout.config as c\n"
        "from queue_rollout import RolloutClient\n"
        "assert EPISODE_JOB_FUNC == 'queue_rollout.workers.episode.run_attempt'\n"
        "assert callable(run_attempt) and callable(c.load_config)\n"
        "print(RolloutClient.__module__)\n")
    assert out.strip() == "queue_rollout.client.rollout"


@pytest.mark.parametrize("module", ["queue_rollout.lab.sim.server",
                                    "queue_rollout.lab.sim.model",
                                    "queue_rollout.engines.sglang",
                                    "queue_rollout.engines.client",
                                    "queue_rollout.workers.workflows",
                                    "queue_rollout.config"])
def test_the_light_parts_load_no_redis_rq_or_ledger(module):
    loaded = fresh_python(f"import {module}\nprint('\\n'.join(sys.modules))").split()
    assert module in loaded
    heavy = [m for m in loaded if m.split(".")[0] in ("redis", "rq")
             or m.startswith(("queue_rollout.ledger", "queue_rollout.client"))]
    assert heavy == []
    if module.startswith("queue_rollout.lab.sim."):  # the simulated replica: alone
        ours = {m for m in loaded if m.startswith("queue_rollout")}
        assert ours <= {"queue_rollout", "queue_rollout.config", "queue_rollout.errors",
                        "queue_rollout.engines", "queue_rollout.engines.synthetic",
                        "queue_rollout.lab", "queue_rollout.lab.sim",
                        "queue_rollout.lab.sim.model", "queue_rollout.lab.sim.prefix_cache",
                        "queue_rollout.lab.sim.tokens", "queue_rollout.lab.sim.server"}, ours


@pytest.mark.parametrize("venv,frameworks", [
    ("sglang", "['sglang', 'torch', 'transformers', 'trl']"),
    ("areal", "['areal', 'torch', 'transformers']"),
])
def test_the_package_and_its_integrations_import_no_framework(venv, frameworks):
    """Where the frameworks are installed (SGLang's venv with TRL; AReaL's venv), with
    this checkout first on the path, importing the package, its client and both
    integrations loads none of them: they load when a trainer uses them."""
    from real_engine.server import find_areal_python, find_sglang_python

    python = find_sglang_python() if venv == "sglang" else find_areal_python()
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no {venv} venv: .ci/run builds one")
        pytest.skip(f"no venv with the frameworks ({venv}'s) to import them from")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import queue_rollout\nfrom queue_rollout import RolloutClient\n"
            "import queue_rollout.integrations.trl, queue_rollout.integrations.areal\n"
            "import importlib.util as u\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'sglang', 'areal')\n"
            "             if u.find_spec(m)))\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', "
            "'trl', 'sglang', 'areal', 'numpy'}))\n")
    out = subprocess.run([python, "-I", "-c", code, str(ROOT)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    installed, loaded = out.stdout.splitlines()
    assert installed == frameworks  # there to load
    assert loaded == "[]"


WORK_PLAN = re.compile(r"\[\d+/\d+\]|DESIGN(\.md)? section|DESIGN 第")


def test_what_ships_and_what_users_read_speaks_of_the_product():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "queue_rollout").rglob("*.py")), *sorted((ROOT / "workers").glob("*")),
             *sorted((ROOT / "queue_rollout").rglob("*.lua"))]
    found = [f"{f.relative_to(ROOT)}:{n}" for f in files if f.is_file()
             for n, line in enumerate(f.read_text().splitlines(), 1) if WORK_PLAN.search(line)]
    assert found == []
    assert EXE is not None
    helps = [subprocess.run([EXE, *cmd, "--help"], capture_output=True, text=True,
                            timeout=60).stdout for cmd in [[], *([c] for c in COMMANDS)]]
    for text in helps:
        assert text.startswith("usage: queue-rollout")
        assert not WORK_PLAN.search(text) and "``" not in text and ":class:" not in text, text
