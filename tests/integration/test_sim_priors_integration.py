"""Learning without traffic (issue 12): measured prior, recency, dithering, background probes, and the

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_sim_priors.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json


def test_priors_cli_writes_records(tmp_path) -> None:
    """`dlb sim --experiment priors` writes {experiment, variant, policy, scenario, converge_s, probe_share}."""
    from dlb.cli import main

    rc = main(["sim", "--experiment", "priors", "--scenarios", "1", "--trials", "1", "--minutes", "0.75",
               "--policies", "Rand,Flow-Lat", "--variants", "prior-x0.02", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    recs = json.loads((tmp_path / "results.json").read_text())
    assert {r["variant"] for r in recs} == {"prior-x0.02/learn", "prior-x0.02/static"}
    for r in recs:
        assert r["experiment"] == "priors" and r["policy"] == "Flow-Lat" and "converge_s" in r and "probe_share" in r
    assert (tmp_path / "priors.md").exists()


# -- change detection on the traffic's own samples (a busy cell sends no probes) -------------------------
