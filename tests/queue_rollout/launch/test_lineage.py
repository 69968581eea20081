"""The record of a launcher's children, and the next launcher stopping what a hard stop
left of them: real processes, in sessions of their own, with children of their own."""

from __future__ import annotations

import json
import subprocess

from queue_rollout.launch.lineage import Lineage
from queue_rollout.procs import session_of, spawn
from testkit import alive, process_tree, wait_for


def session_child() -> subprocess.Popen[bytes]:
    """A child in its own session with a child of its own (as a worker and its episode
    processes), the grandchild ignoring SIGTERM (as a process stuck in a call)."""
    return spawn(["sh", "-c", "sh -c 'trap \"\" TERM; sleep 300' & sleep 300"],
                 start_new_session=True)


def test_the_next_launcher_stops_every_process_of_the_recorded_tree_and_nothing_else(
        tmp_path):
    child, bystander = session_child(), session_child()
    try:
        tree = wait_for(lambda: t if len(t := process_tree(child.pid)) >= 4 else None, 10,
                        "the child's own children")
        Lineage(tmp_path).record([child, None])
        assert json.loads((tmp_path / "procs.json").read_text())["children"][0]["pid"] == \
            child.pid
        found = Lineage(tmp_path).stop_leftovers()  # the next launcher, on its start
        assert found == tree  # the child, its shell's sleep, the grandchild and its sleep
        assert alive(tree) == set()  # the one ignoring SIGTERM too (SIGKILL after 5 s)
        assert alive({bystander.pid}) == {bystander.pid}  # not of the recorded tree
        assert Lineage(tmp_path).stop_leftovers() == set()  # nothing left to stop
    finally:
        for proc in (child, bystander):
            proc.kill()
            proc.wait()


def test_a_record_whose_pid_now_names_another_process_or_another_boot_stops_nothing(
        tmp_path):
    other = session_child()
    try:
        wait_for(lambda: session_of(other.pid) == other.pid, 10, "its session")
        lineage = Lineage(tmp_path)
        lineage.record([other])
        record = json.loads(lineage.path.read_text())
        reused = {**record, "children": [{"pid": other.pid,
                                          "start": record["children"][0]["start"] - 1}]}
        lineage.path.write_text(json.dumps(reused))  # the pid, reused by a later process
        assert Lineage(tmp_path).leftovers() == set()
        lineage.path.write_text(json.dumps({**record, "boot": "another boot"}))
        assert Lineage(tmp_path).leftovers() == set()  # a record from before a reboot
        assert alive({other.pid}) == {other.pid}
    finally:
        other.kill()
        other.wait()
