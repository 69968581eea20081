"""Prometheus file-based service discovery for the processes a launcher runs here.

`up` and `node` write, under ``<state_dir>/prometheus/``, the targets Prometheus should
scrape (``file_sd_configs``: a JSON list of ``{"targets": [...], "labels": {...}}``):
`up` its replicas and its collector's exporter in ``targets.json``, `node` its replicas
in ``node-targets.json``. Every group is labelled ``farm`` (``farm.name``) and ``role``
(``replica`` or ``collector``); a replica also ``gpu`` (the worker pinned to it:
``--gpu``). The replicas of `up` listen on ports chosen when they start, so a fixed
scrape config cannot name them; this file does.

The file is replaced in one rename (Prometheus never reads half of it), only when what
it lists changes, and emptied (``[]``) on a clean stop: Prometheus then drops the
targets at once, whereas a removed file leaves the last ones it read in place. After a
crash it keeps listing the farm's targets, which Prometheus then reports down.
Workers export no metrics of their own: they have no targets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from queue_rollout.config import Config

#: The folder of the target files, under ``farm.state_dir``.
FOLDER = "prometheus"
#: `up`'s target file, under :data:`FOLDER`.
UP_FILE = "targets.json"
#: `node`'s target file, under :data:`FOLDER`.
NODE_FILE = "node-targets.json"
#: Addresses that mean "every address of this host": scraped through loopback.
_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}

TargetGroup = dict[str, Any]


def targets_path(config: Config, name: str = UP_FILE) -> Path:
    """``<state_dir>/prometheus/<name>``."""
    return Path(config.farm.state_dir) / FOLDER / name


def host_port(host: str, port: int) -> str:
    """``host:port`` as Prometheus takes a target (an IPv6 address in brackets)."""
    host = _ANY.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def replica_group(config: Config, url: str, gpu: int) -> TargetGroup:
    """The target group of the replica at *url*: its ``host:port``, its scheme and path
    (``/metrics`` under the URL's path) when they are not Prometheus's defaults."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    labels = {"farm": config.farm.name, "role": "replica", "gpu": str(gpu)}
    if parts.scheme != "http":
        labels["__scheme__"] = parts.scheme
    path = parts.path.rstrip("/")
    if path:
        labels["__metrics_path__"] = f"{path}/metrics"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"targets": [host_port(parts.hostname or "", port)], "labels": labels}


def collector_group(config: Config) -> TargetGroup:
    """The target group of the collector's exporter (``metrics.host:port``)."""
    m = config.metrics
    return {"targets": [host_port(m.host, m.port)],
            "labels": {"farm": config.farm.name, "role": "collector"}}


def up_groups(config: Config, replica_urls: list[str]) -> list[TargetGroup]:
    """What `up` runs: its replicas (replica i serves worker ``--gpu i``) and its
    collector."""
    return [*(replica_group(config, url, i) for i, url in enumerate(replica_urls)),
            collector_group(config)]


def write_targets(path: Path, groups: list[TargetGroup]) -> bool:
    """Make *path* list *groups*: written to a temporary file beside it, then renamed
    over it; nothing is written when it lists them already. True if it was written."""
    text = json.dumps(groups, indent=2) + "\n"
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # not *.json: a glob over the folder skips it
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def clear_targets(path: Path) -> None:
    """On a clean stop: *path* lists nothing (left alone when it was never written)."""
    if path.exists():
        write_targets(path, [])


def write_up_targets(config: Config, replica_urls: list[str]) -> Path:
    """`up`'s target file: its replicas and its collector; returns its path."""
    path = targets_path(config)
    write_targets(path, up_groups(config, replica_urls))
    return path


def write_node_targets(config: Config, replicas: list[tuple[int, str]]) -> Path:
    """`node`'s target file: its replicas, as (GPU, URL) pairs; returns its path."""
    path = targets_path(config, NODE_FILE)
    write_targets(path, [replica_group(config, url, gpu) for gpu, url in replicas])
    return path
