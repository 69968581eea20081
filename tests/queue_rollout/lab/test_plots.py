"""matplotlib for the reports: drawing to files, or a clear error where it is missing."""

from __future__ import annotations

import sys

import pytest

from queue_rollout.errors import ConfigError
from queue_rollout.lab.plots import pyplot


def test_pyplot_draws_to_files():
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"


def test_without_matplotlib_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"pip install 'queue-rollout\[bench\]'"):
        pyplot()
