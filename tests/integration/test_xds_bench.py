"""CI-sized smoke runs of ``dlb bench xds`` (real server process, real gRPC clients)."""

from __future__ import annotations

import json

import pytest

from dlb.cli import main


@pytest.mark.parametrize("extra", [[], ["--delta", "--resources", "20"]], ids=["sotw-route", "delta-clusters"])
def test_bench_xds_smoke(tmp_path, extra):
    out = tmp_path / "xds.json"
    assert main(["bench", "xds", "--streams", "2,5", "--updates", "2", "--json", str(out), *extra]) == 0
    records = json.loads(out.read_text())
    assert [r["streams"] for r in records] == [2, 5]
    for r in records:
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["fanout_ms"] > 0 and r["rss_mb"] >= r["rss_base_mb"] > 0 and r["server_cpu_us_per_update"] > 0
        assert r["protocol"] == ("delta" if extra else "sotw") and r["resources"] == (20 if extra else 1)
