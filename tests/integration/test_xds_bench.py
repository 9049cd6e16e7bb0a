"""CI-sized smoke runs of ``dlb bench xds`` (real server process, real gRPC clients)."""

from __future__ import annotations

import json

import pytest

from dlb.cli import main


@pytest.mark.parametrize("extra", [[], ["--delta", "--resources", "20"], ["--client-impl", "wire"],
                                   ["--client-impl", "wire", "--resources", "20"]],
                         ids=["sotw-route", "delta-clusters", "wire-route", "wire-clusters"])
def test_bench_xds_smoke(tmp_path, extra):
    out = tmp_path / "xds.json"
    assert main(["bench", "xds", "--streams", "2,5", "--updates", "2", "--json", str(out), *extra]) == 0
    records = json.loads(out.read_text())
    assert [r["streams"] for r in records] == [2, 5]
    for r in records:
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["fanout_ms"] > 0 and r["rss_mb"] >= r["rss_base_mb"] > 0 and r["server_cpu_us_per_update"] > 0
        assert r["protocol"] == ("delta" if "--delta" in extra else "sotw")
        assert r["resources"] == (20 if "--resources" in extra else 1)
        assert r["client_impl"] == ("wire" if "wire" in extra else "grpc") and r["client_cpu_us_per_update"] is not None


def test_bench_xds_refuses_wire_clients_it_cannot_run(capsys):
    assert main(["bench", "xds", "--streams", "2", "--client-impl", "wire", "--delta"]) == 2
    assert "--client-impl wire" in capsys.readouterr().err
