"""``dlb up`` above a GIE / llm-d cluster it does not run: one DLB cell and one ``source: gie`` cell whose
probe is a gateway's endpoint-picker ``/metrics`` (:mod:`gie_gateway`: pool averages measured from the
pool's emulated servers), its traffic that gateway's data port. Real Envoys, servers in their own processes.

Rule: the root routes to the GIE cell by those metrics: with both cells fast both take a share; with the
GIE pool's servers slowed 20× its metrics (running requests, queue) say so and its share falls to half
within 30 s and stays down, as a DLB cell's does (tests/e2e/test_foreign_cell_e2e.py, whose load and
measurement this reuses).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from gie_gateway import GieGateway
from test_foreign_cell_e2e import BASELINE_S, DEMO, _config, check_lost_share, dlb_up, slow_cell, start_emulators

from dlb.testbed.emulator import EmulatorProcess

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(360)]


def gie_config(home: list[str], gateway: GieGateway) -> dict:
    """The demo config with its foreign cell swapped for a GIE one: traffic to the gateway, probes to its EPP's /metrics."""
    cfg = _config({"home": home, "partner": []})
    partner = next(c for c in cfg["cells"] if c["name"] == "partner")
    partner.pop("servers")
    partner["leaf"] = {"source": "gie", "address": gateway.address, "probe": gateway.metrics_address}
    return cfg


def test_a_slowed_gie_cell_loses_its_share_within_30_s(tmp_path: Path) -> None:
    assert "source: vllm" in DEMO.read_text() and yaml.safe_load(DEMO.read_text())["cells"][1]["name"] == "partner"
    emus: dict[str, list[EmulatorProcess]] = {}
    try:
        emus = start_emulators(("home", "partner"))
        with GieGateway([e.address for e in emus["partner"]]) as gateway, \
                dlb_up(tmp_path, gie_config([e.address for e in emus["home"]], gateway)) as (load, seen):
            assert not any("leaf partner" in line for line in seen), "dlb up started a leaf for the GIE cell"
            time.sleep(BASELINE_S)
            served_by_gateway = gateway.requests
            results = {"partner": slow_cell(load, emus["partner"], "partner")}
            print("\nGIE-cell share of the root's decisions:", json.dumps(results), f"served {load.served}, failed {len(load.errors)},",
                  f"via the gateway {gateway.requests}")
            assert served_by_gateway > 0  # the root's traffic to the GIE cell went through its gateway
            check_lost_share(results, load)
    finally:
        for es in emus.values():
            for e in es:
                e.close()
