"""Learning without traffic through real Envoys (issue 12): background probes, measured prior, recency.

Two cells, ``local`` (the root's) and ``near`` (30 ms one way, WAN-emulated), one fast-test emulator
each; requests generate 30 tokens (≈ 60–70 ms), so ``local`` is right by ~60 ms of round trip until it
becomes 3× slower (then ``near`` is). The endpoint's configured prior is 50× too slow (a = 3 s), the
issue's case. The leaves run the default background-probe settings except the probe size, set to the
requests' (the ``background-probe`` plugin's ``max_tokens: 30``), and the testbed's 1-s refit.

Each phase waits (bounded poll) for the routing to reach the right cell and records how long it took
in ``RESULTS`` (printed; the issue's target is ≤ 30 s). The bound the polls enforce is looser (60 s),
so a loaded CI box does not fail them; a run that never gets there fails. The return to ``local`` after
its slowdown is held to the target itself: it takes ~17 s, and the bug it guards against (a model
measured from the few probes that declared the change published with confidence 0, which the root
ignores) made it ~35 s.
"""

from __future__ import annotations

import time

import pytest
from bounded_wait import until

from dlb.testbed.stack import CellSpec, metric_value, request, start_data_plane

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(420)]

TOKENS = 30
ENDPOINT = {
    "name": "chat",
    "match": {"prefix": "/v1/"},
    "policy": {"mechanism": "discrete", "cost": "latency", "aversion": {"enabled": False}},
    "latency_prior": {"a_s": 3.0, "b_s": 0.1, "c": 4, "s": 1},  # ≈ 50× the real ~60 ms
}
BODY = {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}
BOUND_S = 60.0
TARGET_S = 30.0
RESULTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def plane():
    p = start_data_plane([CellSpec("local"), CellSpec("near")], "local", ENDPOINT, one_way_ms={"local": {"near": 30}},
                         plugins=({"type": "background-probe", "parameters": {"max_tokens": TOKENS}},))
    p.started = time.monotonic()
    try:
        yield p
    finally:
        print("learning e2e convergence (s):", RESULTS)
        p.close()


def _root_a(plane, cell: str) -> float | None:
    return metric_value(plane.root_metrics(), "dlb_root_cell_model", cell=cell, param="a_s")


def _until_routed_to(plane, cell: str, what: str, window: int = 10, share: float = 0.8) -> float:
    """Send requests one after another until ≥ share of the last ``window`` went to ``cell``; seconds taken."""
    host, port = plane.root_url
    t0 = time.monotonic()
    recent: list[str] = []
    while time.monotonic() - t0 < BOUND_S:
        status, h, _ = request(host, port, body=BODY)
        recent = (recent + [h.get("x-dlb-server", "") if status == 200 else f"status-{status}"])[-window:]
        if len(recent) == window and sum(s.startswith(f"{cell}-") for s in recent) >= share * window:
            RESULTS[what] = round(time.monotonic() - t0, 1)
            return RESULTS[what]
    raise AssertionError(f"{what}: not routed to {cell} within {BOUND_S} s; last: {recent}")


def test_models_are_measured_without_any_client_traffic(plane):
    """With no client request at all, background probes replace the ×50 prior in every cell's model
    (as the root sees it) by the measured latency. Fails without probes: a_s stays 3.0."""
    host, port = plane.emulators["local"][0].address.rsplit(":", 1)
    t0 = time.perf_counter()
    assert request(host, int(port), body=BODY)[0] == 200
    real = time.perf_counter() - t0  # one request straight at the server: what the model should say

    def measured() -> bool:
        a = [_root_a(plane, c) for c in ("local", "near")]
        return all(x is not None and x < 3 * real + 0.05 for x in a)

    until(measured, f"models measured (real ≈ {real:.3f} s)", timeout=BOUND_S, period=0.2)
    RESULTS["prior_x50_measured_after_start"] = round(time.monotonic() - plane.started, 1)
    leaf = plane.leaf_metrics("local")
    assert metric_value(leaf, "dlb_leaf_background_probes_total", outcome="ok") >= 3
    assert metric_value(leaf, "dlb_leaf_background_probes_total", outcome="failed") == 0
    _until_routed_to(plane, "local", "prior_x50_routed_local")


def _straight_to_leaf(plane, cell: str, n: int) -> None:
    """``n`` requests one after another straight at ``cell``'s leaf Envoy (clients that reach the cell
    without this root): samples the leaf measures and the root never routed."""
    hp = plane.cfg.cell(cell).leaf.address
    statuses = [request(hp.host, hp.port, body=BODY)[0] for _ in range(n)]
    assert statuses == [200] * n, statuses


def test_a_cell_that_becomes_3x_slower_loses_its_traffic_and_wins_it_back_when_fast_again(plane):
    """local 3× slower → traffic moves to near; local healthy again → it gets no traffic, but its
    probes show it is fast, and traffic comes back (the starvation loop of paper §6, broken).

    While local is slow, 30 requests reach its leaf straight (not through this root), so its window is
    full of slow samples: no handful of fast probes can outvote them, and only the change the probes
    declare brings local back — the path that took ~35 s when the model it published had confidence 0
    (checked: fails without that fix; with it ~17 s)."""
    _until_routed_to(plane, "local", "before_slowdown")
    emu = plane.emulators["local"][0]
    emu.set_faults(slowdown=3.0)
    try:
        _until_routed_to(plane, "near", "slow_3x_moved_to_near")
        _straight_to_leaf(plane, "local", 30)
    finally:
        emu.set_faults(slowdown=1.0)
    assert _until_routed_to(plane, "local", "recovered_back_to_local") <= TARGET_S, RESULTS
    # Probe traffic of the cell that was idle most of the time: probes per second, and the share of
    # its one server's time they occupied (an upper bound of the capacity share: the server batches).
    leaf = plane.leaf_metrics("near")
    elapsed = time.monotonic() - plane.started
    RESULTS["near_probes_per_s"] = round(metric_value(leaf, "dlb_leaf_background_probes_total", outcome="ok") / elapsed, 3)
    RESULTS["near_probe_busy_share"] = round(metric_value(leaf, "dlb_leaf_background_probe_seconds_total") / elapsed, 4)


def test_a_restarted_leaf_is_back_in_the_roots_view_quickly(plane):
    """A restarted local leaf starts from the ×50 prior (traffic leaves for near) and its warm-up probes
    bring the measured model, and the traffic, back."""
    _until_routed_to(plane, "local", "before_restart")
    plane.restart_leaf("local")
    _until_routed_to(plane, "local", "restart_back_to_local")
    leaf = plane.leaf_metrics("local")
    assert metric_value(leaf, "dlb_leaf_background_probes_total", outcome="ok") >= 1


def _capacity_rps(emu) -> float:
    """What one emulated server can serve (requests/s of TOKENS tokens at its full batch), from its profile."""
    cfg = emu._config
    prof = cfg.resolved_profile()
    return cfg.max_batch / (TOKENS * prof.step_time(cfg.max_batch) * cfg.faults.slowdown)


def _probes(plane, cell: str) -> float:
    leaf = plane.leaf_metrics(cell)
    return sum(metric_value(leaf, "dlb_leaf_background_probes_total", outcome=o) or 0.0 for o in ("ok", "failed"))


def _idle_probe_share(plane, cells: tuple[str, ...], what: str, window_s: float = 32.0) -> dict[str, float]:
    """Background probes each cell's leaf sent through its real leaf Envoy during ``window_s`` with no client
    traffic (every cell idle: the most they probe; a busy cell sends none), ÷ what the cell could serve.
    The window spans ≥ 2 of the longest probe interval (15 s), so the count is off by at most one probe."""
    before = {c: _probes(plane, c) for c in cells}
    t0 = time.monotonic()
    time.sleep(window_s)
    dt = time.monotonic() - t0
    share = {}
    for c in cells:
        capacity = sum(_capacity_rps(e) for e in plane.emulators[c])
        share[c] = (_probes(plane, c) - before[c]) / (capacity * dt)
        RESULTS[f"{what}_{c}_idle_probe_share_of_capacity"] = round(share[c], 4)
    return share


def test_probe_traffic_is_a_small_share_of_capacity(plane):
    """Probe traffic as a share of capacity, measured through the real Envoys while idle (target ≤ 1 %)."""
    share = _idle_probe_share(plane, ("local", "near"), "prior_x50")
    assert all(0 < v < 0.01 for v in share.values()), share


FAST_PRIOR = dict(ENDPOINT, latency_prior={"a_s": 0.0012, "b_s": 0.0001, "c": 4, "s": 1})  # a: 0.02× the real


@pytest.fixture(scope="module")
def fast_prior_plane():
    """The ×0.02 case: a prior 50× too fast on every cell hides that ``local`` is 4× slow (≈ 250 ms, from the
    start): by the prior both cells take ~1 ms and ``local`` wins by the round trip; ``near`` is right."""
    from dlb.emulator.faults import Faults

    p = start_data_plane([CellSpec("local", emulator={"faults": Faults(slowdown=4.0)}), CellSpec("near")], "local",
                         FAST_PRIOR, one_way_ms={"local": {"near": 30}},
                         plugins=({"type": "background-probe", "parameters": {"max_tokens": TOKENS}},))
    p.started = time.monotonic()
    try:
        yield p
    finally:
        print("learning e2e convergence, prior x0.02 (s):", RESULTS)
        p.close()


def test_a_prior_50x_too_fast_is_measured_and_the_slow_cell_avoided(fast_prior_plane):
    """The root's model of ``local`` rises from the prior's 1.2 ms to what its probes measure, and traffic
    goes to ``near`` (timed from the data plane's start: the probes' warm-up is part of it)."""
    plane = fast_prior_plane
    # the slow cell's ~250 ms, not the prior's 1.2 ms
    until(lambda: (_root_a(plane, "local") or 0.0) > 0.1, "local's model measured", timeout=BOUND_S, period=0.2)
    RESULTS["prior_x0.02_measured_after_start"] = round(time.monotonic() - plane.started, 1)
    _until_routed_to(plane, "near", "prior_x0.02_routed_near")
    # The slow cell is one server at a quarter speed: its budget interval (~30 s) is capped at 15 s, ~0.5 %
    # of its capacity (the 5-s cap this replaced made it 1.43 %).
    share = _idle_probe_share(plane, ("local", "near"), "prior_x0.02")
    assert all(0 < v < 0.01 for v in share.values()), share
