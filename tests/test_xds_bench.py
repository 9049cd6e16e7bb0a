"""CI-sized smoke run of ``dlb bench xds`` (real server process, real gRPC clients)."""

from __future__ import annotations

import json

from dlb.cli import main


def test_bench_xds_smoke(tmp_path):
    out = tmp_path / "xds.json"
    assert main(["bench", "xds", "--streams", "2,5", "--updates", "2", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [r["streams"] for r in records] == [2, 5]
    for r in records:
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert 0 < r["fanout_ms"] and r["rss_mb"] >= r["rss_base_mb"] > 0
