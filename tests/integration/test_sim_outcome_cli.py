"""``dlb sim --server-model`` runs the chosen model and every record names it (runs git: integration tier)."""

from __future__ import annotations

import json

from dlb.cli import main


def test_cli_server_model_is_recorded(tmp_path) -> None:
    out = tmp_path / "o"
    assert main(["sim", "--server-model", "batched", "--minutes", "0.15", "--scenarios", "1", "--trials", "1",
                 "--policies", "Rand,Disc-RIF", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    recs = json.loads((out / "results.json").read_text())
    assert {r["server_model"] for r in recs} == {"batched"}
    assert all("shed_rate" in r and "mean_latency_with_failures" in r for r in recs)
