"""``dlb up`` with a Disc-Lat root above a foreign cell (vLLM-style servers, or a GIE gateway in front of
them): the root's probe state for that cell carries a latency model fitted from the cell's own
whole-request latency histogram, and it follows the cell when it is slowed. Real Envoys, emulated servers
in their own processes (:mod:`test_foreign_cell_e2e`'s load and measurement).

Rules: with both cells fast, the foreign cell's model has confidence > 0 (fitted, not the prior) and the
root uses both cells; slowed 20×, the fitted curve rises ≥ 3× (its unloaded latency ℓ(1), so load alone
cannot explain it; and ℓ at the cell's RIF too), and the Disc-Lat root's share for the cell falls to half
within 30 s. Servers of 2 slots each, so 8 clients load both cells past their knee and latency decides.
The foreign cell has users of its own (2 clients straight to it), as a cluster DLB does not run has: once
the root moves away, theirs are the completions its histogram still sees.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from gie_gateway import GieGateway
from test_foreign_cell_e2e import BASELINE_S, TOKENS, WITHIN_S, Load, Threads, _config, check_lost_share, dlb_up, slow_cell, start_emulators
from test_foreign_gie_e2e import gie_config

from dlb.core.latency_model import latency
from dlb.testbed.emulator import EmulatorProcess
from dlb.testbed.stack import request

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(420)]

PARAM = re.compile(r'dlb_root_cell_model\{cell="partner",param="(\w+)"\} (\S+)')
RIF = re.compile(r'dlb_root_cell_rif\{cell="partner"\} (\S+)')


class OwnUsers(Threads):
    """The foreign cell's own users, who do not come through DLB: ``n`` clients sending to its entry
    (each server in turn, or its gateway) back to back. Their requests feed its histogram, as a real
    cluster's users do, whether or not the root sends it anything."""

    def __init__(self, entries: list[str], n: int = 2) -> None:
        super().__init__()
        self.entries, self.served = entries, 0
        self._threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in range(n)]

    def _client(self, k: int) -> None:
        body = {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}
        while not self._stop.is_set():
            host, port = self.entries[k % len(self.entries)].rsplit(":", 1)
            k += 1
            with contextlib.suppress(OSError):
                if request(host, int(port), body=body, timeout=60)[0] == 200:
                    self.served += 1


class ModelWatch:
    """The root's probe state for the foreign cell, read from its /metrics every 0.5 s: (t, confidence, ℓ(1), ℓ(RIF))."""

    def __init__(self, load: Load) -> None:
        self.url, self.rows = load.root_metrics, list[tuple[float, float, float, float]]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            text = urllib.request.urlopen(self.url, timeout=5).read().decode()
            p = {k: float(v) for k, v in PARAM.findall(text)}
            rif = RIF.search(text)
            if len(p) == 5 and rif and p["s"] > 0:
                curve = (p["a_s"], p["b_s"], p["c"], p["s"])
                self.rows.append((time.monotonic(), p["confidence"], float(latency(1.0, *curve)), float(latency(float(rif[1]), *curve))))

    def __enter__(self) -> ModelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def median(self, since: float, until: float) -> tuple[float, float, float]:
        rows = [r for r in list(self.rows) if since <= r[0] <= until]
        assert rows, f"no model of the foreign cell in the root's metrics in [{since:.0f}, {until:.0f}]"
        return tuple(statistics.median(r[k] for r in rows) for k in (1, 2, 3))  # type: ignore[return-value]


def _disc_lat(cfg: dict) -> dict:
    for ep in cfg["endpoints"]:
        ep["policy"] = {"mechanism": "discrete", "cost": "latency"}
    return cfg


@pytest.mark.parametrize("source", ["vllm", "gie"])
def test_a_foreign_cells_fitted_model_follows_a_slowdown_and_disc_lat_moves_away(tmp_path: Path, source: str) -> None:
    emus: dict[str, list[EmulatorProcess]] = {}
    gateway: GieGateway | None = None
    try:
        emus = start_emulators(("home", "partner"), max_batch=2)
        servers = {c: [e.address for e in es] for c, es in emus.items()}
        if source == "gie":
            gateway = GieGateway(servers["partner"]).__enter__()
            cfg = gie_config(servers["home"], gateway)
        else:
            cfg = _config(servers)
        entries = [gateway.address] if gateway is not None else servers["partner"]
        with dlb_up(tmp_path, _disc_lat(cfg)) as (load, _seen), OwnUsers(entries) as users, ModelWatch(load) as watch:
            time.sleep(BASELINE_S)
            at = time.monotonic()
            results = {"partner": slow_cell(load, emus["partner"], "partner")}
            conf, unloaded, at_rif = watch.median(at - 8.0, at)
            conf_slow, unloaded_slow, at_rif_slow = watch.median(at + WITHIN_S - 8.0, at + WITHIN_S)
            model = {"confidence": (conf, conf_slow), "l(1)": (unloaded, unloaded_slow), "l(rif)": (at_rif, at_rif_slow)}
            print(f"\n{source} foreign cell, Disc-Lat root:", json.dumps(results), "model fast→slowed:",
                  json.dumps({k: [round(x, 3) for x in v] for k, v in model.items()}),
                  f"served {load.served}, failed {len(load.errors)}, own users {users.served}")
            assert conf > 0 and conf_slow > 0, model  # fitted from the cell's histogram, not the prior
            assert unloaded_slow > 3.0 * unloaded and at_rif_slow > 3.0 * at_rif, model
            check_lost_share(results, load)
    finally:
        if gateway is not None:
            gateway.__exit__(None, None, None)
        for es in emus.values():
            for e in es:
                e.close()
