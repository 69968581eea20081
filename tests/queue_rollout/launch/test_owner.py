"""One owner per farm directory: a second holder is refused with the first one named,
a dead holder's lock is taken over, and nothing is written by the one refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from queue_rollout.errors import FarmBusy
from queue_rollout.launch.owner import Owner


def test_a_second_owner_is_refused_naming_the_first_and_may_take_it_once_released(tmp_path):
    path = tmp_path / "state" / "farm.lock"
    first = Owner(path, "farm f is already up")
    first.acquire()
    with pytest.raises(FarmBusy, match=rf"farm f is already up: pid {os.getpid()} since \d{{4}}-"):
        Owner(path, "farm f is already up").acquire()
    assert FarmBusy.exit_code == 2
    first.release()
    with Owner(path, "farm f is already up") as again:
        assert again.holder().startswith(f"pid {os.getpid()} since ")


def test_the_lock_of_a_holder_killed_with_sigkill_is_taken_over(tmp_path):
    path = tmp_path / "farm.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from queue_rollout.launch.owner import Owner;"
         "Owner(sys.argv[1], 'busy').acquire(); print('held', flush=True); time.sleep(60)",
         str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FarmBusy, match=f"busy: pid {holder.pid} since"):
            Owner(path, "busy").acquire()
    finally:
        holder.kill()
        holder.wait()
    with Owner(path, "busy"):  # no stale file to judge: the kernel dropped the lock
        pass


def test_a_record_being_written_reads_as_an_unknown_pid(tmp_path):
    path = tmp_path / "farm.lock"
    path.write_text("")
    assert Owner(path, "busy").holder() == "pid unknown"
