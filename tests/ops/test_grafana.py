"""grafana/: the alerting rules pass promtool, every dashboard query names metrics the
exporter or a replica exports, and every dashboard query returns data from a real
Prometheus scraping a small farm under load (collector, two workers, two replicas,
a trainer consuming batches)."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import msgspec
import pytest

from queue_rollout import RolloutClient
from queue_rollout.collector.metrics import FarmMetrics
from queue_rollout.config import Config
from queue_rollout.errors import BarrierTimeout
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.launch.targets import collector_group, up_groups, write_targets
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Registry
from testkit import G2_B2, write_farm

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NO_PROMTOOL = "promtool not on PATH (Debian package `prometheus`)"
NO_PROMETHEUS = "prometheus not on PATH (Debian package `prometheus`)"
# what the test's Prometheus substitutes for Grafana's variables (1 s scrapes)
GRAFANA_VARS = {"$__rate_interval": "10s", "${__rate_interval}": "10s",
                "$__interval": "1s", "${__interval}": "1s", "$__range": "1m",
                "$farm": "graf"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN"}


def dashboard() -> dict:
    return json.loads((GRAFANA / "dashboard.json").read_text())


def panels(board: dict) -> list[dict]:
    """Every panel that queries, rows' collapsed panels included (rows and text left
    out)."""
    out = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return [p for p in out if p.get("type") not in ("row", "text")]


def dashboard_exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(dashboard()) for t in p["targets"]]


def alert_rules() -> list[dict[str, str]]:
    """alerts.yml's rules, read line by line (no YAML library in the venv): each rule
    starts with `- alert: NAME` and keeps its expr on one `expr:` line."""
    rules: list[dict[str, str]] = []
    for line in (GRAFANA / "alerts.yml").read_text().splitlines():
        if m := re.match(r"\s*- alert: (\S+)\s*$", line):
            rules.append({"alert": m.group(1)})
        elif rules and (m := re.match(r"\s+(expr|summary|description|severity|for):\s*(.*)$",
                                      line)):
            rules[-1][m.group(1)] = m.group(2).strip()
    return rules


def alert_exprs() -> list[tuple[str, str]]:
    return [(r["alert"], r["expr"]) for r in alert_rules()]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names,
    durations and Grafana variables left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range durations
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    found = re.findall(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", e)
    return {n for n in found if n not in PROMQL_WORDS}


def sample_names(exposition: str) -> set[str]:
    return {re.match(r"[A-Za-z_:][\w:]*", line).group(0)
            for line in exposition.splitlines() if line and not line.startswith("#")}


def substitute(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr!r}"
    return expr


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]


# -- a: the alerting rules -----------------------------------------------------------


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_alert_rules_pass_promtool_check_rules():
    out = subprocess.run([PROMTOOL, "check", "rules", str(GRAFANA / "alerts.yml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {a for a, _ in alert_exprs()} >= {
        "QueueRolloutDoubtfulAttemptsRising", "QueueRolloutNoBatchDelivered",
        "QueueRolloutNoWorkers", "QueueRolloutWorkersLost", "QueueRolloutStalenessNearBudget"}
    for rule in alert_rules():
        assert rule.get("expr") and rule.get("severity"), rule
        assert rule.get("summary") and rule.get("description"), rule


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_the_example_scrape_config_passes_promtool_check_config():
    out = subprocess.run([PROMTOOL, "check", "config", str(GRAFANA / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (GRAFANA / "prometheus.yml").read_text()
    assert "job_name: queue-rollout-collector" in text  # QueueRolloutCollectorDown's job


def file_sd_files() -> list[str]:
    """The ``files`` of each ``file_sd_configs`` of prometheus.yml, in order."""
    text = (GRAFANA / "prometheus.yml").read_text()
    return [f for line in re.findall(r"^\s+- files: \[(.*)\]$", text, re.MULTILINE)
            for f in json.loads(f"[{line}]")]


def test_the_scrape_config_reads_the_target_files_up_and_node_write(tmp_path):
    """Both jobs read, relative to prometheus.yml, the target folder of a farm with the
    default state_dir started in the checkout's top folder, and the pattern takes both
    `up`'s and `node`'s files (and not the temporary file beside them)."""
    import fnmatch
    import os

    from queue_rollout.launch.targets import NODE_FILE, targets_path

    text = (GRAFANA / "prometheus.yml").read_text()
    assert [line for line in text.splitlines()  # static targets only as a commented example
            if "static_configs" in line and not line.lstrip().startswith("#")] == []
    files = file_sd_files()
    assert len(files) == 2 and len(set(files)) == 1  # the collector's job and sglang's
    config = msgspec.convert({}, Config)
    folder = os.path.normpath(GRAFANA / os.path.dirname(files[0]))
    assert folder == os.path.normpath(GRAFANA.parent / targets_path(config).parent)
    pattern = os.path.basename(files[0])
    for name in (targets_path(config).name, NODE_FILE):
        assert fnmatch.fnmatch(name, pattern), name
    assert not fnmatch.fnmatch(targets_path(config).name + ".tmp", pattern)
    # each job keeps its own role, and the collector's own farm label stays farm
    jobs = re.split(r"^  - job_name: ", text, flags=re.MULTILINE)[1:]
    roles = {job.split()[0]: re.findall(r"source_labels: \[role\]\s+regex: (\w+)", job)
             for job in jobs}
    assert roles == {"queue-rollout-collector": ["collector"], "sglang": ["replica"]}
    assert "honor_labels: true" in jobs[0] and "honor_labels" not in jobs[1]


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_alert_rules_fire_on_the_series_they_are_meant_for(tmp_path):
    """`promtool test rules` on synthetic farms: in trouble, healthy, without workers,
    and a farm in trouble beside a healthy one (only the first one's alerts fire, each
    with its farm)."""

    def series(farm: str = "a", **values: str) -> list[dict[str, str]]:
        s = f'job="queue-rollout-collector", instance="{farm}:9464", farm="{farm}"'
        out = []
        for name, v in values.items():
            if name.startswith("staleness_le_"):
                le = name.removeprefix("staleness_le_").replace("_", ".").replace("inf", "+Inf")
                out.append({"series": f'queue_rollout_consumed_group_staleness_bucket'
                                      f'{{{s}, le="{le}"}}', "values": v})
            else:
                prefix = "" if name == "up" else "queue_rollout_"
                out.append({"series": f"{prefix}{name}{{{s}}}", "values": v})
        return out

    def firing(at: str, *alerts: str) -> dict:
        return {"expr": 'count by (alertname) (ALERTS{alertstate="firing"})', "eval_time": at,
                "exp_samples": [{"labels": f'{{alertname="{a}"}}', "value": 1}
                                for a in sorted(alerts)]}

    def firing_in(farm: str, at: str, *alerts: str) -> dict:
        return {"expr": 'count by (alertname, farm) (ALERTS{alertstate="firing"})',
                "eval_time": at,
                "exp_samples": [{"labels": f'{{alertname="{a}", farm="{farm}"}}', "value": 1}
                                for a in sorted(alerts)]}

    trouble = series(doubtful_attempts="0+1x40", groups_in_flight="5x40",
                     batches_delivered_total="3x40", workers_alive="4x20 3x20",
                     staleness_le_1_0="0x40", staleness_le_2_0="0+10x40",
                     staleness_le_inf="0+10x40", up="1x30 0x10",
                     redis_wait_replicas="1x40", redis_replicas_acked="1x20 0x20")
    healthy = series("b", doubtful_attempts="1x40", groups_in_flight="5x40",
                     batches_delivered_total="0+1x40", workers_alive="4x40",
                     staleness_le_1_0="0+10x40", staleness_le_2_0="0+10x40",
                     staleness_le_inf="0+10x40", up="1x40",
                     redis_wait_replicas="1x40", redis_replicas_acked="1x40")
    no_workers = series(workers_alive="2x5 0x20", up="1x25")
    tests = {
        "rule_files": [str(GRAFANA / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": trouble, "promql_expr_test": [
                firing("30m", "QueueRolloutDoubtfulAttemptsRising",
                       "QueueRolloutNoBatchDelivered", "QueueRolloutWorkersLost",
                       "QueueRolloutStalenessNearBudget", "QueueRolloutRedisReplicasShort"),
                firing("40m", "QueueRolloutDoubtfulAttemptsRising",
                       "QueueRolloutNoBatchDelivered", "QueueRolloutStalenessNearBudget",
                       "QueueRolloutCollectorDown", "QueueRolloutRedisReplicasShort")]},
            {"interval": "1m", "input_series": healthy,
             "promql_expr_test": [firing("30m")]},
            {"interval": "1m", "input_series": no_workers, "promql_expr_test": [
                firing("15m", "QueueRolloutNoWorkers", "QueueRolloutWorkersLost")]},
            {"interval": "1m", "input_series": trouble + healthy, "promql_expr_test": [
                firing_in("a", "30m", "QueueRolloutDoubtfulAttemptsRising",
                          "QueueRolloutNoBatchDelivered", "QueueRolloutWorkersLost",
                          "QueueRolloutStalenessNearBudget", "QueueRolloutRedisReplicasShort"),
                # b's collector is up: a's is down all the same
                firing_in("a", "40m", "QueueRolloutDoubtfulAttemptsRising",
                          "QueueRolloutNoBatchDelivered", "QueueRolloutStalenessNearBudget",
                          "QueueRolloutCollectorDown", "QueueRolloutRedisReplicasShort")]},
        ],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(json.dumps(tests))  # JSON is YAML
    out = subprocess.run([PROMTOOL, "test", "rules", str(path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# -- b: the dashboard's queries name exported metrics ---------------------------------


def test_metric_names_are_parsed_out_of_promql():
    assert metric_names('histogram_quantile(0.9, max by (le) (rate(a_bucket{x="y"}[5m])))'
                        " * 60 / sglang:gen_throughput and on (i) up") == {
        "a_bucket", "sglang:gen_throughput", "up"}
    assert metric_names("max(rate(queue_rollout_x_total[$__rate_interval])) * 1e3") == {
        "queue_rollout_x_total"}


def test_every_panel_queries_metrics_the_farm_exports(r):
    board = dashboard()
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"]
    ds = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert [v["name"] for v in ds] == ["DS_PROMETHEUS"] and ds[0]["query"] == "prometheus"
    provisioned = (GRAFANA / "provisioning/datasources/prometheus.yaml").read_text()
    uid = re.search(r"^\s+uid: (\S+)$", provisioned, re.MULTILINE).group(1)
    assert ds[0]["current"]["value"] == uid  # the variable defaults to the provisioned one
    provider = (GRAFANA / "provisioning/dashboards/queue-rollout.yaml").read_text()
    assert re.search(r"^\s+type: file$", provider, re.MULTILINE)
    found = panels(board)
    assert len(found) >= 10
    assert len({p["id"] for p in found}) == len(found), "panel ids must be unique"
    for p in found:
        assert p["targets"], f"panel {p['title']!r} has no target"
        assert all(t.get("expr", "").strip() for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]

    config = msgspec.convert({"farm": {"name": "g"}}, Config)
    # a live worker: its slots are a series of their own
    Registry(r, Keys("g"), config.timeouts.lease).register("w0", {"slots": 4})
    exported = sample_names(FarmMetrics(Ledger.from_config(r, config), config)
                            .exposition().decode())
    with ThreadedSimEngine(slots=2, step_ms=1.0) as engine, \
            urllib.request.urlopen(engine.url + "/metrics", timeout=5) as resp:
        exported |= sample_names(resp.read().decode())
    assert {"queue_rollout_sample_slots", "sglang:num_running_reqs"} <= exported
    for title, expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported"
    for alert, expr in alert_exprs():
        names = metric_names(expr) - {"up"}
        assert names <= exported, f"{alert}: {sorted(names - exported)} not exported"
    needed = {"queue_rollout_admission_mode_info", "queue_rollout_paused",
              "queue_rollout_rollout_interval_seconds_bucket",
              "queue_rollout_rollout_interval_seconds_sum",
              "queue_rollout_sample_slots_reserved", "queue_rollout_sample_slots",
              "queue_rollout_active_episodes", "queue_rollout_groups_admitted_total",
              "queue_rollout_groups_accepted_total", "queue_rollout_groups_rejected_total",
              "queue_rollout_groups_ready", "queue_rollout_batch_interval_seconds_bucket",
              "queue_rollout_consumed_group_staleness_bucket",
              "queue_rollout_doubtful_attempts", "queue_rollout_workers_alive",
              "sglang:num_running_reqs", "sglang:gen_throughput",
              "queue_rollout_prefill_tokens_total", "queue_rollout_placements_total",
              "queue_rollout_worker_slots"}
    used = set().union(*(metric_names(e) for _, e in dashboard_exprs()))
    assert needed <= used, f"no panel for {sorted(needed - used)}"


def test_the_first_row_asks_whether_refill_helps():
    """The dashboard opens on the mode, the occupancy, the slots reserved but not
    running, the doubt and the rollout interval, and points at `plan --from-farm`."""
    board = dashboard()["panels"]
    assert board[0]["type"] == "row" and board[0]["title"] == "Is refill helping?"
    end = next(i for i, p in enumerate(board[1:], 1) if p["type"] == "row")
    first = board[1:end]
    assert all(p["gridPos"]["y"] < board[end]["gridPos"]["y"] for p in first)
    exprs = " ".join(t["expr"] for p in first for t in p.get("targets", []))
    for name in ("queue_rollout_admission_mode_info", "queue_rollout_active_episodes",
                 "queue_rollout_sample_slots", "queue_rollout_sample_slots_reserved",
                 "queue_rollout_doubtful_attempts", "queue_rollout_paused",
                 "queue_rollout_rollout_interval_seconds_bucket"):
        assert name in metric_names(exprs), name
    [text] = [p for p in first if p["type"] == "text"]
    assert "plan --from-farm" in text["options"]["content"]


def unfiltered_selectors(expr: str, matcher: str) -> list[str]:
    """The selectors of *expr*'s metrics that lack the label matcher *matcher*."""
    out = []
    for name in metric_names(expr):
        for m in re.finditer(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])(\{[^}]*\})?", expr):
            if matcher not in (m.group(1) or ""):
                out.append(m.group(0))
    return out


def test_unfiltered_selectors_are_found():
    expr = 'max(a{farm="$farm"}) / max(rate(b{x="y"}[1m])) + c + a'
    assert sorted(unfiltered_selectors(expr, 'farm="$farm"')) == ["a", 'b{x="y"}', "c"]


def test_the_dashboard_shows_one_farm_every_query_filters_on():
    """A `farm` variable fed from the exporter's farm label; every metric selector of
    every panel (SGLang's too: the target files label replicas) filters on it."""
    [farm] = [v for v in dashboard()["templating"]["list"] if v["name"] == "farm"]
    assert farm["type"] == "query" and farm["datasource"]["uid"] == "${DS_PROMETHEUS}"
    assert farm["query"] == "label_values(queue_rollout_workers_alive, farm)"
    assert not farm["multi"] and not farm["includeAll"]  # max() over one farm's collectors
    exprs = dashboard_exprs()
    assert len(exprs) > 20
    unfiltered = [(title, sel) for title, expr in exprs
                  for sel in unfiltered_selectors(expr, 'farm="$farm"')]
    assert unfiltered == []


def test_alerts_aggregate_by_farm():
    """Every aggregation of every alert keeps the farm label: one farm's trouble fires
    its own alert, named in the summary."""
    for rule in alert_rules():
        aggregations = re.findall(r"\b(?:max|min|sum|avg|count)\b\s*(by\s*\([^)]*\))?\s*\(",
                                  rule["expr"])
        assert aggregations, rule["alert"]
        assert all("farm" in by for by in aggregations), rule
        assert "absent(" not in rule["expr"], rule  # it would drop the farm label
        assert "{{ $labels.farm }}" in rule["summary"], rule


# -- c: every panel returns data from a real Prometheus -------------------------------


class Trainer(threading.Thread):
    """Consumes batches and advances the policy version every third batch."""

    def __init__(self, client: RolloutClient) -> None:
        super().__init__(daemon=True, name="trainer")
        self.client, self.stop, self.batches, self.error = client, threading.Event(), 0, None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    batch = self.client.get_batch(timeout=1, max_poll_s=0.05)
                except BarrierTimeout:
                    continue
                self.client.ack(batch)
                self.batches += 1
                if self.batches % 3 == 0:
                    self.client.set_version(self.client.version() + 1)
        except Exception as exc:
            self.error = exc


class RunningSampler(threading.Thread):
    """Reads the ledger's running attempts every 0.1 s: (wall time, running) pairs."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(daemon=True, name="running-sampler")
        self.ledger, self.stop = ledger, threading.Event()
        self.samples: list[tuple[float, int]] = []

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.samples.append((time.time(), self.ledger.counters().get("running", 0)))

    def mean(self, start: float, end: float) -> float:
        inside = [n for t, n in self.samples if start <= t <= end]
        assert len(inside) > 100, f"{len(inside)} samples from {start} to {end}"
        return sum(inside) / len(inside)


OCCUPANCY_WINDOW_S = 40


@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
@pytest.mark.e2e
def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path, redis_url):
    metrics_port, prom_port = free_port(), free_port()
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "graf", "redis_url": redis_url},
                      rollout={**G2_B2, "max_staleness": 100, "placement": "group"},
                      engine={"slots_per_replica": 4, "adaptive_slots": True,
                              "threads_per_process": 4},
                      timeouts={"shutdown_grace": 2}, metrics={"port": metrics_port})
    client = RolloutClient.from_config(toml)
    trainer = Trainer(client)
    running = RunningSampler(client.ledger)
    procs: list[subprocess.Popen] = []
    prometheus: subprocess.Popen | None = None
    prom_log = tmp_path / "prometheus.log"
    engines: list[ThreadedSimEngine] = []
    # a second farm on the same Redis and Prometheus: its exporter alone
    other_config = msgspec.convert({"farm": {"name": "other", "redis_url": redis_url},
                                    "metrics": {"port": free_port()}}, Config)
    other = FarmMetrics(Ledger.from_config(connect(redis_url), other_config), other_config)

    def spawn(*args: str) -> None:
        proc = subprocess.Popen([EXE, *args, "-c", str(toml)], stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline(), f"queue-rollout {args[0]} exited at start"

    try:
        for _ in range(2):
            engines.append(ThreadedSimEngine(slots=4, step_ms=2.0))
        for gpu, engine in enumerate(engines):
            spawn("worker", "--gpu", str(gpu), "--engine-url", engine.url)
        spawn("collector")
        client.submit([{"id": f"p{i:04d}", "prompt": "x",
                        "member_lengths": [50 + 10 * (i % 10), 300]} for i in range(1500)])
        trainer.start()
        running.start()

        # the target files `up` would write for these farms, read by the shipped
        # prometheus.yml (its file_sd path pointed at them, 1 s scrapes)
        folder = tmp_path / "state" / "prometheus"
        write_targets(folder / "targets.json", up_groups(client.config, [e.url for e in engines]))
        other.serve()
        write_targets(folder / "other.json", [collector_group(other_config)])
        shipped = (GRAFANA / "prometheus.yml").read_text()
        for old, new in (("scrape_interval: 15s", "scrape_interval: 1s"),
                         ("evaluation_interval: 15s", "evaluation_interval: 1s"),
                         ("- alerts.yml", f"- {GRAFANA / 'alerts.yml'}"),
                         ("../.queue-rollout/prometheus/*.json", f"{folder}/*.json")):
            assert old in shipped, old
            shipped = shipped.replace(old, new)
        (tmp_path / "prometheus.yml").write_text(shipped)
        prom_started = time.time()
        with prom_log.open("w") as log:
            prometheus = subprocess.Popen(
                [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=log, stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{prom_port}/api/v1"

        def wait(what: str, check, timeout: float):
            deadline = time.monotonic() + timeout
            while True:
                assert prometheus.poll() is None, f"prometheus exited:\n{prom_log.read_text()}"
                assert trainer.error is None, f"trainer: {trainer.error!r}"
                try:
                    problem = check()
                except OSError as exc:  # not listening yet
                    problem = repr(exc)
                if problem is None:
                    return
                assert time.monotonic() < deadline, f"{what}: {problem}"
                time.sleep(0.5)

        def targets_up():
            active = get_json(api + "/targets")["activeTargets"]
            down = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in active
                    if t["health"] != "up"]
            return None if len(active) == 4 and not down else f"{len(active)} targets, {down}"

        wait("scrape targets up", targets_up, timeout=20)

        exprs = [(title, substitute(expr)) for title, expr in dashboard_exprs()]
        results: dict[str, list] = {}

        def every_query_has_data():
            for _title, expr in exprs:
                query = urllib.parse.urlencode({"query": expr})
                results[expr] = get_json(f"{api}/query?{query}")["result"]
            empty = [f"{t}: {e}" for t, e in exprs if not results[e]]
            nan = [f"{t}: {e} = {results[e]}" for t, e in exprs
                   if results[e] and not any(math.isfinite(float(s["value"][1]))
                                             for s in results[e])]
            return None if not empty and not nan else f"empty: {empty}; only NaN: {nan}"

        wait("every dashboard query returns data", every_query_has_data, timeout=40)

        def value(expr: str) -> float:
            return max(float(s["value"][1]) for s in results[substitute(expr)])

        # the farm was busy while Prometheus watched it: not just zeros
        assert value('max(queue_rollout_sample_slots{farm="$farm"})') == 8
        assert value('max(queue_rollout_workers_alive{farm="$farm"})') == 2
        rate = ('max(rate(queue_rollout_groups_admitted_total{farm="$farm"}[$__rate_interval]))'
                " * 60")
        assert value(rate) > 0
        placed = ('max by (how) (rate(queue_rollout_placements_total{farm="$farm"}'
                  "[$__rate_interval])) * 60")
        assert value(placed) > 0  # the farm places groups: the panel shows them
        assert len(results['sum by (instance) (sglang:num_running_reqs{farm="graf"})']) == 2
        per_worker = results['max by (worker) (queue_rollout_worker_slots{farm="graf"})']
        assert sorted(float(s["value"][1]) for s in per_worker) == [4.0, 4.0]

        def query(expr: str) -> list:
            return get_json(f"{api}/query?{urllib.parse.urlencode({'query': expr})}")["result"]

        # the two farms stay apart, each collector's own farm label kept as farm
        alive = {s["metric"]["farm"]: float(s["value"][1])
                 for s in query("max by (farm) (queue_rollout_workers_alive)")}
        assert alive == {"graf": 2.0, "other": 0.0}
        assert query('{__name__=~"queue_rollout_.*", farm=""}') == []
        assert query('{exported_farm!=""}') == []
        gpus = {(s["metric"]["farm"], s["metric"]["gpu"])
                for s in query("sglang:num_running_reqs")}
        assert gpus == {("graf", "0"), ("graf", "1")}  # the target file's labels

        def rules_evaluated():
            rules = [r for g in get_json(api + "/rules")["groups"] for r in g["rules"]]
            bad = [(r["name"], r["health"], r.get("lastError")) for r in rules
                   if r["health"] != "ok"]
            return None if len(rules) == len(alert_exprs()) and not bad else f"{bad}"

        wait("alert rules evaluate without error", rules_evaluated, timeout=10)
        assert trainer.batches > 0

        # the occupancy stat over a window: the ledger's running over slots, averaged
        # over the same window by the sampler
        [stat] = [p for p in panels(dashboard()) if p["title"] == "Occupancy over the range"]
        window = f"{OCCUPANCY_WINDOW_S}s"
        occupancy = stat["targets"][0]["expr"].replace("$__range", window)
        while time.time() < prom_started + OCCUPANCY_WINDOW_S + 4:  # scraped all along
            assert trainer.error is None and prometheus.poll() is None
            time.sleep(1)
        end = time.time() - 1  # a scrape's value is in the TSDB by now
        at = urllib.parse.urlencode({"query": substitute(occupancy), "time": f"{end:.3f}"})
        [sample] = get_json(f"{api}/query?{at}")["result"]
        panel = float(sample["value"][1])
        ledger = running.mean(end - OCCUPANCY_WINDOW_S, end) / 8
        assert 0 < ledger <= 1
        assert abs(panel - ledger) <= 0.1 * ledger, (panel, ledger)
        assert client.ledger.counters().get("running", 0) > 0  # busy to the end
    finally:
        running.stop.set()
        trainer.stop.set()
        if trainer.is_alive():
            trainer.join(10)
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(15)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait(5)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for engine in engines:
            engine.close()
        other.close()
