"""Child processes: they die with their parent, however it dies; supervised ones are
restarted with backoff that doubles in a crash loop and starts over after a child that
ran healthy for a while (the clock is passed in)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import HEALTHY_S, ChildRefused, Supervised, cli_exe, log_tail, stop_all
from testkit import free_ports, process_tree, wait_for, write_farm


def test_backoff_doubles_in_a_crash_loop_and_starts_over_after_a_healthy_run():
    clock = ManualClock(start=100.0)
    child = Supervised("quick exit", [sys.executable, "-c", "pass"], clock=clock)
    child.keep()  # first start
    delays = []
    for _ in range(3):  # it dies at once, three times
        assert child.proc is not None
        child.proc.wait()
        child.keep()  # notices the exit: no restart before the backoff
        assert child.proc is None
        delays.append(child.next_start - clock.now)
        clock.now = child.next_start
        child.keep()  # restarted
    assert delays == [1.0, 2.0, 4.0] and child.restarts == 3
    child.proc.wait()
    clock.now += HEALTHY_S  # this run lasted long enough to count as healthy
    child.keep()
    assert child.restarts == 1 and child.next_start - clock.now == 1.0
    clock.now = child.next_start
    child.keep()
    child.proc.wait()


def _gone(pid: int) -> bool:
    """No such process, or a zombie waiting for a reaper that is not its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["spawn", "die_with_parent"])
def test_a_child_dies_with_its_parent_killed_by_sigkill(how):
    """A parent started (a) a program through spawn, (b) a Python child that asked by
    itself (as the bench's multiprocessing clients do); SIGKILL the parent, and the
    child gets SIGTERM."""
    start = {
        "spawn": "p = spawn(['sleep', '60']); print(p.pid, flush=True)",
        "die_with_parent": (
            "import os, subprocess; p = subprocess.Popen([sys.executable, '-c', "
            "f'from queue_rollout.procs import die_with_parent; import time; "
            "assert die_with_parent({os.getpid()}); print(1, flush=True); time.sleep(60)'], "
            "stdout=subprocess.PIPE, text=True); p.stdout.readline(); print(p.pid, flush=True)"),
    }[how]
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time\nfrom queue_rollout.procs import spawn\n"
                               f"{start}\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not _gone(child)
    finally:
        parent.kill()
        parent.wait()
    wait_for(lambda: _gone(child), 10, f"the child {child} to die with its parent")


def test_the_request_says_whether_the_parent_it_names_is_still_the_parent():
    """The request is made after fork: a parent already gone by then (the child's
    parent is another process) means the child must not run."""
    code = ("import os, sys; from queue_rollout.procs import die_with_parent; "
            "print(die_with_parent(int(sys.argv[1])), die_with_parent(os.getppid()))")
    out = subprocess.run([sys.executable, "-c", code, str(os.getpid() + 1)],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


# -- every launcher's whole tree dies with it ------------------------------------------

def _started(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): a pid and this name one
    process, whatever reuses the pid later; None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _write_farm(tmp_path: Path, redis_url: str = "") -> Path:
    """2 simulated replicas of 2 slots; an embedded Redis unless *redis_url*."""
    return write_farm(
        tmp_path / "farm.toml",
        farm={"name": "tree", "state_dir": tmp_path / "state", "redis_url": redis_url},
        rollout={"group_size": 2, "batch_size": 1, "max_concurrent_samples": 4},
        engine={"replicas": 2, "slots_per_replica": 2, "base_port": free_ports(2)},
        metrics={"port": free_port()}, timeouts={"shutdown_grace": 2})


# (the command after `queue-rollout`, what the tree must hold before the kill: a piece
# of some process's command line, or "redis-server", whose command line is rewritten)
EPISODES = "queue_rollout.workers.rq_worker"
LAUNCHERS = {
    "up": (lambda tmp, url: ["up", "-c", str(_write_farm(tmp))],
           ["redis-server", "sim-engine", "worker --gpu 0", "worker --gpu 1", EPISODES,
            "collector"]),
    "node": (lambda tmp, url: ["node", "--gpus", "0-1", "-c", str(_write_farm(tmp, url))],
             ["sim-engine", "worker --gpu 0", "worker --gpu 1", EPISODES]),
    "demo": (lambda tmp, url: ["demo", "-c", str(_write_farm(tmp))],
             ["redis-server", "sim-engine", "worker --gpu 0", EPISODES, "collector"]),
    "bench": (lambda tmp, url: ["bench", "--profile", "long-tail", "-c",
                                str(_write_farm(tmp))],
              ["redis-server", "sim-engine", "worker --gpu 0", EPISODES, "collector"]),
    "plan": (lambda tmp, url: ["plan", "--profile", "long-tail", "--gpus", "64",
                               "-c", str(_write_farm(tmp))],
             ["redis-server"]),
}


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_sigkill_of_a_launcher_leaves_no_process_of_its_tree(launcher, tmp_path, redis_url):
    args, wants = LAUNCHERS[launcher]
    with (tmp_path / "launcher.log").open("w") as log:
        proc = subprocess.Popen([cli_exe(), *args(tmp_path, redis_url)],
                                stdout=subprocess.DEVNULL, stderr=log)

    def grown() -> dict[int, int] | None:
        assert proc.poll() is None, (tmp_path / "launcher.log").read_text()
        tree = {pid: _started(pid) for pid in process_tree(proc.pid)}
        lines = [_cmdline(pid) for pid in tree]
        lines += ["redis-server" for pid in tree
                  if Path(f"/proc/{pid}/comm").exists()
                  and "redis-server" in Path(f"/proc/{pid}/comm").read_text()]
        ready = all(any(want in line for line in lines) for want in wants)
        return {p: s for p, s in tree.items() if s is not None} if ready else None

    try:
        tree = wait_for(grown, 120, f"{launcher}'s process tree")
    finally:
        proc.kill()
        proc.wait()
    described = {pid: _cmdline(pid) for pid in tree}
    killed_at = time.monotonic()
    wait_for(lambda: all(_started(p) != s or _gone(p) for p, s in tree.items()), 30,
             f"every process of {launcher}'s tree to end: {described}")
    print(f"{launcher}: {len(tree)} processes, all gone {time.monotonic() - killed_at:.1f} s "
          "after the SIGKILL")


def test_the_end_of_a_child_s_log_for_the_message_saying_it_exited(tmp_path):
    log = tmp_path / "replica-gpu0.log"
    assert log_tail(log) == "" and log_tail(None) == ""
    log.write_text("".join(f"line {i}\n" for i in range(5000)))
    assert log_tail(log, 3) == "line 4997\nline 4998\nline 4999"


def test_a_child_that_exits_is_reported_with_the_end_of_its_log(tmp_path, caplog):
    log = tmp_path / "child.log"
    child = Supervised("failing child", [sys.executable, "-c", "import sys; sys.exit('no sglang')"],
                       log_path=log)
    child.keep()
    assert child.proc is not None and child.proc.wait(30) == 1
    child.keep()
    assert f"failing child exited (1); restarting; the end of {log}:\nno sglang" in caplog.text


def test_a_child_that_exits_on_bad_input_is_not_restarted_and_says_why(tmp_path):
    """Exit 2 (bad input or config, e.g. a port in use) would only be refused again: the
    supervisor raises what the child said instead of restarting it forever."""
    log = tmp_path / "collector.log"
    said = "queue-rollout: metrics.port 9464 is in use: [Errno 98] Address already in use"
    child = Supervised("collector", [sys.executable, "-c",
                                     f"import sys; print({said!r}, file=sys.stderr); "
                                     "sys.exit(2)"], log_path=log)
    child.keep()
    assert child.proc is not None and child.proc.wait(30) == 2
    with pytest.raises(ChildRefused) as refused:
        child.keep()
    assert refused.value.exit_code == 2
    assert str(refused.value) == (
        "collector exited with 2 (bad input or config), not restarted: metrics.port 9464 "
        f"is in use: [Errno 98] Address already in use (its log: {log})")
    child.keep()
    assert child.proc is None and (child.exits, child.last_exit) == (1, 2)  # not started


_IGNORES_SIGTERM = ("import signal, subprocess, sys, time; "
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']); "
                    "time.sleep(120)")


def test_a_set_event_kills_every_process_at_once_with_its_own_children(tmp_path):
    """A second Ctrl-C: stop_all stops waiting for processes that take their time (here:
    they ignore SIGTERM) and kills them, each with its process group (a child started in
    its own session takes its episode processes with it)."""
    children = [Supervised(f"stubborn {i}", [sys.executable, "-c", _IGNORES_SIGTERM],
                           new_session=True) for i in range(2)]
    grandchildren = []
    for child in children:
        child.keep()
        assert child.proc is not None
        grandchildren.append(wait_for(lambda c=child: _grandchild(c.proc), 30,
                                      "the grandchild"))
        assert os.getpgid(child.proc.pid) == child.proc.pid  # a session of its own
    now = threading.Event()
    threading.Timer(0.5, now.set).start()
    started = time.monotonic()
    stop_all([c.proc for c in children if c.proc], 600, now=now)
    assert time.monotonic() - started < 300  # not the 600 s it would have waited
    assert all(c.proc is not None and c.proc.returncode == -9 for c in children)
    wait_for(lambda: all(_gone(pid) for pid in grandchildren), 30, "the grandchildren gone")


def _grandchild(proc: subprocess.Popen | None) -> int | None:
    """The one process *proc* started, once it has."""
    kids = [] if proc is None else [pid for pid in process_tree(proc.pid) if pid != proc.pid]
    return kids[0] if kids else None
