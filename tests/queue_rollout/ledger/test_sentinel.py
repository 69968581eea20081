"""Sentinel URLs: parsed and refused with the password hidden; every command finds the
primary through the Sentinels (with their own password) and `status` names it; an
unknown service or Sentinels that are all down is exit 4. (A failover under a running
farm: tests/test_failover.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_rollout.cli.main import main
from queue_rollout.errors import ConfigError
from queue_rollout.ledger.connection import SentinelTarget, parse_sentinel_url
from queue_rollout.ledger.embedded import free_port
from testkit import SentinelSet, write_farm

SECRET = "s3cr3t-sentinel"


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path_factory.mktemp("sentinel"), sentinel_password=SECRET)
    yield s
    s.stop()


def _toml(tmp_path: Path, url: str, sentinel_password: str = SECRET) -> str:
    return str(write_farm(tmp_path / "farm.toml", farm={
        "name": "sn", "redis_url": url, "sentinel_password": sentinel_password}))


def test_parse_sentinel_url() -> None:
    assert parse_sentinel_url(
        "rediss+sentinel://u:p%40ss@h1:26380,[::1],h3/svc?db=2") == SentinelTarget(
        sentinels=(("h1", 26380), ("::1", 26379), ("h3", 26379)), service="svc", db=2,
        username="u", password="p@ss", tls=True)
    assert parse_sentinel_url("redis+sentinel://h:1/s").password is None


@pytest.mark.parametrize(("url", "problem"), [
    ("redis+sentinel://:pw@/svc", "names no Sentinel"),
    ("redis+sentinel://:pw@h:port/svc", "numeric port"),
    ("redis+sentinel://:pw@h:26379", "name the service"),
    ("redis+sentinel://:pw@h:26379/", "name the service"),
    ("redis+sentinel://:pw@h:26379/svc?ssl=1", "only query parameter"),
    ("redis+sentinel://:pw@h:26379/svc?db=x", "db must be a number"),
])
def test_a_malformed_sentinel_url_says_what_and_hides_the_password(url: str,
                                                                     problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as info:
        parse_sentinel_url(url)
    assert "pw" not in str(info.value).replace("password", "")


@pytest.mark.e2e
def test_status_finds_the_primary_through_the_sentinels(sentinels: SentinelSet,
                                                        tmp_path: Path, capsys) -> None:
    assert main(["status", "--json", "-c", _toml(tmp_path, sentinels.url)]) == 0
    out = capsys.readouterr().out
    status = json.loads(out)
    assert status["redis_primary"] == f"127.0.0.1:{sentinels.primary_port()}"
    assert status["redis_replicas"] == 1 and status["redis_wait_replicas"] == 0
    assert SECRET not in out


@pytest.mark.e2e
def test_without_the_sentinels_password_or_with_an_unknown_service_it_is_exit_4(
        sentinels: SentinelSet, tmp_path: Path, capsys) -> None:
    assert main(["status", "-c", _toml(tmp_path, sentinels.url, "wrong")]) == 4
    unknown = sentinels.url.rsplit("/", 1)[0] + "/nope"
    assert main(["status", "-c", _toml(tmp_path, unknown)]) == 4
    err = capsys.readouterr().err
    assert "No master found for 'nope'" in err and SECRET not in err


@pytest.mark.e2e
def test_all_sentinels_down_is_exit_4_and_a_malformed_url_exit_2(tmp_path: Path,
                                                                 capsys) -> None:
    down = f"redis+sentinel://:datapw@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/qr"
    assert main(["status", "-c", _toml(tmp_path, down)]) == 4
    assert main(["doctor", "-c", _toml(tmp_path, "redis+sentinel://:datapw@h:x/qr")]) == 2
    captured = capsys.readouterr()
    assert "datapw" not in captured.out + captured.err
    assert "bad Sentinel URL redis+sentinel://:***@h:x/qr" in captured.err
