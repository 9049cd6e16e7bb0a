"""The demo's embedded deployment: cells in real regions, heterogeneous emulated GPU servers.

Default (``DEFAULT_FLEET``): four cells — two in North America, two in Europe — with the one-way
latencies of the simulator's region table (:mod:`dlb.sim.regions`: great-circle distance, fibre,
route inflation), emulated on the leaf Envoys and on the roots' probes (``--emulate-wan``):

- us-east1: 3 × ``llama-8b-h100`` (the H100-class profile);
- us-central1: 2 × ``llama-8b-h100``;
- europe-west4: 2 × ``llama-8b-h200-eager`` — the measured H200 step times *with* their eager-mode
  10–19 ms per-step floor, i.e. a slower class of server (../shared/data/h200-llama-step-times.json);
- europe-west1: 2 × ``llama-8b-h200-eager``.

Clients enter at two source cells (us-east1, europe-west4: each runs a root Envoy + root service).
Residency: traffic entering in europe-west4 stays in Europe. Endpoints: chat (``/v1/chat/``, discrete
latency-cost routing with session affinity on ``x-session-id``) and completions (``/v1/``, flow
routing with the gradient cost).

Capacity is computed from the profiles (:func:`server_capacity_rps`), so the workload rate is a
stated fraction of it rather than a guess. Every address is a free port on 127.0.0.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlb.procutil import free_port, free_port_block


@dataclass(frozen=True)
class CellPlan:
    name: str  # also the region of dlb.sim.regions
    servers: int
    profile: str
    root: bool = False


@dataclass(frozen=True)
class Fleet:
    cells: tuple[CellPlan, ...]
    allowed: dict[str, list[str]] = field(default_factory=dict)
    max_batch: int = 8
    #: Wall seconds per profile second. > 1 slows the emulated GPUs down so that the whole fleet's
    #: capacity fits what two shared CPU cores can push through Envoy and Python.
    time_scale: float = 4.0
    #: Mid-run degradation: this cell's servers run ``degrade_slowdown`` times slower. us-central1 at 3×
    #: takes ~20 % of the fleet's capacity away, so a fleet at 75 % load stays (just) under capacity.
    degrade_cell: str = "us-central1"
    degrade_slowdown: float = 3.0
    #: ``dlb demo --dp G``: every server of ``dp_cell`` is a data-parallel group of G lock-step ranks
    #: (``dlb serve emulator --dp-size G``), whose leaf picks the rank with BF-IO (docs/bfio.md). 0 = off.
    dp_ranks: int = 0
    dp_cell: str = "europe-west1"
    #: The leaves' latency-model window and refit period (the ``latency-fit`` plugin the demo writes): a
    #: short window forgets a past slowdown within the demo's time scale. The simulator twin fits with the
    #: same two numbers, or its models move on another time scale than the real leaves'
    #: (research/compare-stress/slowcell/README.md).
    fit_window_s: float = 10.0
    refit_period_s: float = 1.0

    def ranks(self, cell: str) -> int:
        """HTTP endpoints per server of ``cell``: its DP ranks, or 1."""
        return self.dp_ranks if self.dp_ranks > 0 and cell == self.dp_cell else 1


DEFAULT_FLEET = Fleet(
    cells=(
        CellPlan("us-east1", 3, "llama-8b-h100", root=True),
        CellPlan("us-central1", 2, "llama-8b-h100"),
        CellPlan("europe-west4", 2, "llama-8b-h200-eager", root=True),
        CellPlan("europe-west1", 2, "llama-8b-h200-eager"),
    ),
    allowed={"europe-west4": ["europe-west4", "europe-west1"]},
)


def one_way_ms(names: list[str]) -> dict[str, dict[str, float]]:
    """Half the simulator's RTT between each pair of regions (ms, rounded to 0.1)."""
    from dlb.sim.regions import REGIONS, rtt_s

    by_name = {r.name: r for r in REGIONS}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ValueError(f"cells: {', '.join(missing)} not in the region table (dlb/sim/regions.py); "
                         "give network.one_way_ms in your own config instead")
    out: dict[str, dict[str, float]] = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out.setdefault(a, {})[b] = round(rtt_s(by_name[a], by_name[b]) * 1000 / 2, 1)
    return out


def server_capacity_rps(profile_name: str, max_batch: int, mean_prompt: float, mean_output: float, time_scale: float) -> float:
    """Requests per wall second one emulated server completes when kept full.

    A full server runs ``max_batch`` sequences; each step decodes one token for each and prefills
    the prompts of the sequences that join (``max_batch / mean_output`` per step on average). So a
    request occupies a slot for ``mean_output`` steps of ``step_time(max_batch, prefill per step)``.
    """
    from dlb.emulator.profile import load_profile

    prof = load_profile(profile_name)
    prefill_per_step = max_batch * mean_prompt / max(mean_output, 1.0)
    step_s = prof.step_time(max_batch, int(prefill_per_step))
    return max_batch / (mean_output * step_s * time_scale)


def fleet_capacity_rps(fleet: Fleet, mean_prompt: float, mean_output: float) -> dict[str, float]:
    # A DP group's G ranks each run max_batch sequences (their lock step costs some of it: the idle time
    # BF-IO reduces; the demo's load fraction leaves room for it).
    return {c.name: c.servers * fleet.ranks(c.name) * server_capacity_rps(c.profile, fleet.max_batch, mean_prompt, mean_output,
                                                                           fleet.time_scale)
            for c in fleet.cells}


#: The demo endpoints' ``timeout_s``: what their roots' deadline shedding and leaves' admission judge by
#: (the load generator's clients give up at 60 s, ``dlb.testbed.scenarios.REQUEST_TIMEOUT_S``).
ENDPOINT_TIMEOUT_S = 600.0


def server_addresses(fleet: Fleet) -> dict[str, list[str]]:
    """A free address per server (a free block of ports per data-parallel server)."""
    return {c.name: [f"127.0.0.1:{free_port_block(fleet.ranks(c.name))}" for _ in range(c.servers)] for c in fleet.cells}


def demo_config(fleet: Fleet, server_addrs: dict[str, list[str]]) -> dict[str, Any]:
    """The DLB config of ``fleet`` (a dict; JSON is YAML) with every service on a free port."""
    names = [c.name for c in fleet.cells]
    n_roots = max(1, sum(1 for c in fleet.cells if c.root))
    cells = []
    for c in fleet.cells:
        servers: list[Any] = list(server_addrs[c.name])
        if fleet.ranks(c.name) > 1:
            servers = [{"address": a, "dp_ranks": fleet.ranks(c.name), "policy": "bf-io", "horizon": 10,
                        "max_num_seqs": fleet.max_batch} for a in servers]
        item: dict[str, Any] = {
            "name": c.name,
            "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
            "servers": servers,
        }
        if c.root:
            item["root"] = {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}
        cells.append(item)
    return {
        "version": 1,
        "cells": cells,
        "network": {"one_way_ms": one_way_ms(names), **({"allowed": fleet.allowed} if fleet.allowed else {})},
        "endpoints": [
            {"name": "chat", "match": {"prefix": "/v1/chat/"},
             "policy": {"mechanism": "discrete", "cost": "latency",
                        "affinity": {"enabled": True, "header": "x-session-id", "ttl_s": 600, "prefix_savings_ms": 50}},
             "latency_prior": {"a_s": 2.0, "b_s": 0.1, "c": 8, "s": 1}, "timeout_s": ENDPOINT_TIMEOUT_S},
            {"name": "completions", "match": {"prefix": "/v1/"},
             "policy": {"mechanism": "flow", "cost": "gradient", "flow": {"period_ms": 200, "kappa": 0.5}},
             "latency_prior": {"a_s": 2.0, "b_s": 0.1, "c": 8, "s": 1}, "timeout_s": ENDPOINT_TIMEOUT_S},
        ],
        "probe": {"period_ms": 50, "timeout_ms": 300, "stale_after_ms": 1500, "backoff_max_ms": 2000},
        "services": {
            "control_plane": {"xds": f"127.0.0.1:{free_port()}", "status": f"127.0.0.1:{free_port()}"},
            # A block per root: dlb up gives the k-th root metrics and admin port + k.
            "root": {"ext_proc": f"127.0.0.1:{free_port()}", "metrics": f"127.0.0.1:{free_port_block(n_roots)}",
                     "admin": f"127.0.0.1:{free_port_block(n_roots)}"},
        },
    }
