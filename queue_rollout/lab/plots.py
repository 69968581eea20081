"""matplotlib for the lab's reports (``bench --out``, ``plan --out``): loaded only when
a report is drawn, and named in a clear error where it is not installed."""

from __future__ import annotations

from typing import Any

from queue_rollout.errors import ConfigError


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files; a clear error where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--out draws plots with matplotlib: "
                          "pip install 'queue-rollout[bench]'") from None
    return plt
