"""Leaf admission (:mod:`dlb.core.admission`): a leaf refuses a request its server would, by Little's law,
keep past a share of the client's deadline, and the simulator's DLB leaves do so under overload."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from dlb.core.admission import AdmissionConfig, CompletionRate, StayFloor, admits, record_done, uncongested_stay
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import Disruption
from tests.unit.test_sim_engine import batched_scenario

CFG = AdmissionConfig(enabled=True, deadline_s=60.0, fraction=0.5, slowdown=2.0)  # target 30 s, window 10 s, >= 8 in flight
DEADLINE_ONLY = replace(CFG, slowdown=0.0)


def _served(rate_per_s: float, until: float, start: float = 0.0) -> CompletionRate:
    r = CompletionRate(start, CFG.window_s)
    for k in range(1, int((until - start) * rate_per_s) + 1):
        r.record(start + k / rate_per_s)
    return r


@pytest.mark.parametrize("until", [2.0, 10.0, 60.0])
def test_the_completion_rate_is_unbiased_from_the_first_seconds(until: float) -> None:
    """Divided by the weight the watched time has had, a steady 5/s reads 5/s after 2 s as after a minute
    (divided by the whole window, it would read 0.9/s after 2 s)."""
    assert _served(5.0, until).rate(until) == pytest.approx(5.0, rel=0.12)


def test_the_completion_rate_decays_when_nothing_finishes_and_restarts_on_reset() -> None:
    r = _served(5.0, 60.0)
    assert r.rate(60.0 + CFG.window_s) == pytest.approx(5.0 / math.e, rel=0.12)
    r.reset(100.0)
    assert r.rate(100.0) == 0.0 and r.since == 100.0


def test_a_server_past_the_target_stay_refuses_and_one_below_it_admits() -> None:
    """At 5 completions/s a server holding n stays (n + 1)/5 s: below 30 s it admits, from 30 s it refuses
    (its uncongested stay, 1 s, is far below: only the deadline decides)."""
    r = _served(5.0, 60.0)
    floor = _floor_at(1.0)
    assert admits(100, r, 60.0, CFG, floor)  # 20 s
    assert not admits(155, r, 60.0, CFG, floor)  # 31 s
    assert not admits(400, r, 60.0, CFG, floor)
    assert not admits(155, r, 60.0, DEADLINE_ONLY)


def _floor_at(stay_s: float, until: float = 120.0) -> StayFloor:
    """A server watched until ``until`` holding ``5 · stay_s`` requests at 5 completions/s: Little's stay ``stay_s``."""
    rate, floor = CompletionRate(0.0, CFG.window_s), StayFloor(CFG.stay_window_s, CFG.floor_rise_s)
    for k in range(1, int(until * 5) + 1):
        record_done(rate, floor, k / 5, round(5 * stay_s))
    return floor


def test_the_stay_floor_is_the_servers_littles_law_stay_and_rises_only_slowly() -> None:
    """Sampled once the rate has a window behind it, the floor reads the stay ``n / X``; a slower stretch
    does not lift it, and with no lower sample it rises by e per ``floor_rise_s``."""
    floor = _floor_at(35.0)
    assert floor.value(120.0) == pytest.approx(35.0, rel=0.05)
    rate = CompletionRate(0.0, CFG.window_s)
    for k in range(1, 601):
        record_done(rate, floor, 120.0 + k / 5, 500)  # a congested stretch: 100 s stays
    assert floor.value(240.0) < 1.3 * 35.0
    # It rises only while completions come (by e per floor_rise_s of them); an idle gap counts one window.
    risen, rate = _floor_at(35.0), CompletionRate(0.0, CFG.window_s)
    for k in range(1, int(CFG.floor_rise_s * 5) + 1):
        record_done(rate, risen, 120.0 + k / 5, 1000)  # 200-s stays for a whole floor_rise_s
    assert risen.value(120.0 + CFG.floor_rise_s) == pytest.approx(35.0 * math.e, rel=0.05)
    idle = floor.value(240.0 + 3600.0)
    assert idle == pytest.approx(floor.value(240.0) * math.exp(CFG.stay_window_s / CFG.floor_rise_s), rel=0.01)
    fresh = StayFloor(CFG.stay_window_s, CFG.floor_rise_s)
    for k in range(int(fresh.min_weight) - 1):
        fresh.record(float(k), 10.0)
    assert fresh.value(10.0) == 0.0  # too few samples: no floor yet


def test_a_server_slow_only_because_its_requests_are_long_is_not_refused() -> None:
    """Stays of ~36 s against a 30-s target: the deadline alone refuses (the rule before the floor), the floor
    (35 s uncongested) admits it, and refuses once the server is twice as slow as that."""
    r, floor = _served(5.0, 120.0), _floor_at(35.0)
    assert not admits(180, r, 120.0, DEADLINE_ONLY, floor)
    assert admits(180, r, 120.0, CFG, floor)
    assert not admits(360, r, 120.0, CFG, floor)  # 72 s: 2x its own pace
    # A floor learnt at saturation (never seen uncongested) counts only up to floor_cap x the model's unloaded
    # latency: with a = 3 s the 35-s floor is read as 12 s, and the deadline's 30 s decides.
    assert not admits(180, r, 120.0, CFG, floor, unloaded_s=3.0)
    assert admits(180, r, 120.0, CFG, floor, unloaded_s=20.0)  # long requests: a = 20 s, the floor stands
    assert admits(180, r, 120.0, replace(CFG, floor_cap=0.0), floor, unloaded_s=3.0)  # no cap
    # The stay admission compares with (the leaf's gauge shows it): capped, uncapped, none yet.
    assert uncongested_stay(floor, 120.0, CFG, 3.0) == pytest.approx(CFG.floor_cap * 3.0)
    assert uncongested_stay(floor, 120.0, CFG) == pytest.approx(floor.value(120.0))
    assert floor.value(120.0) > CFG.floor_cap * 3.0
    assert uncongested_stay(StayFloor(CFG.stay_window_s, CFG.floor_rise_s), 120.0, CFG, 3.0) == 0.0
    # Before it has a floor (a start: the rate lags arrivals by a stay) it is admitted, unless stuck.
    assert admits(360, r, 120.0, CFG, StayFloor(CFG.stay_window_s, CFG.floor_rise_s))
    assert not admits(360, CompletionRate(0.0, CFG.window_s), 120.0, CFG, StayFloor(CFG.stay_window_s, CFG.floor_rise_s))


def test_guards_admit_a_quiet_server_a_new_one_and_everything_when_off() -> None:
    idle = CompletionRate(0.0, CFG.window_s)  # nothing finished yet
    assert admits(CFG.min_inflight - 1, idle, 60.0, CFG)  # too few in flight to judge
    assert admits(500, idle, CFG.window_s - 1.0, CFG)  # watched for less than a window
    assert not admits(CFG.min_inflight, idle, 60.0, CFG)  # a window with nothing finished: stuck
    assert admits(500, idle, 60.0, AdmissionConfig(enabled=False, deadline_s=60.0))
    assert admits(500, idle, 60.0, AdmissionConfig(enabled=True))  # no deadline: never


@pytest.mark.parametrize(("field", "value"), [("deadline_s", 0.0), ("fraction", 0.0), ("fraction", 1.5),
                                              ("window_s", 0.0), ("min_inflight", 0), ("slowdown", -1.0),
                                              ("slowdown", math.inf), ("stay_window_s", 0.0),
                                              ("floor_cap", -1.0)])
def test_bad_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        AdmissionConfig(**{field: value})


def test_an_overloaded_batched_server_serves_more_in_time_when_its_leaf_refuses_early() -> None:
    """One batched server at ~2/3 of its rate for a minute, then ~1.5x for a minute, 10-s timeout, a DLB root
    (Disc-RIF). Without admission every admitted request slows the batch until most are cancelled in
    service; with it the leaf refuses what would stay past a third of it (and twice the pace it kept in the
    first minute), so more requests are answered in time and fewer fail."""
    sc, t = replace(batched_scenario(20.0, 120.0), disruption=Disruption("burst", 60.0, 120.0, burst_cell=0, burst_extra=25.0)), 10.0
    off = simulate(sc, "Disc-RIF", 0, SimConfig(request_timeout_s=t, admission=False))
    on = simulate(sc, "Disc-RIF", 0, SimConfig(request_timeout_s=t, admission=True))
    assert off.admission_refused == 0 and on.admission_refused > 0
    assert on.shed >= on.admission_refused
    in_time = [int(np.count_nonzero(r.latency <= t)) for r in (off, on)]
    assert in_time[1] > 1.05 * in_time[0]
    assert on.cancelled < off.cancelled / 5  # the work goes to requests that finish, not to ones cut at the timeout
    fail = [r.summary()["client_failure_rate"] for r in (off, on)]
    assert fail[1] < fail[0]
    assert on.summary()["mean_latency_with_failures"] < off.summary()["mean_latency_with_failures"]
    assert on.completed + on.errors + on.shed + on.cancelled + on.in_flight == on.arrivals
    assert on.rif_end.tolist() == [0]


def test_long_requests_on_an_uncongested_server_are_served_not_refused() -> None:
    """One batched server well below its rate whose requests are long (0.15 s per decoded token: ~24 s each)
    against a 60-s timeout: the deadline alone refuses most of them (its stays are past a third of it), the
    floor admits nearly all, and fewer fail than with the deadline alone."""
    sc = batched_scenario(1.0, 300.0)
    sc = replace(sc, decode_token_s=np.array([0.15]), workload=replace(sc.workload, decode_token_s=0.15))
    runs = {name: simulate(sc, "Disc-RIF", 0, SimConfig(request_timeout_s=60.0, admission_slowdown=sd))
            for name, sd in (("deadline", 0.0), ("floor", 2.0))}
    assert runs["deadline"].admission_refused > runs["deadline"].arrivals / 2
    assert runs["floor"].admission_refused < runs["floor"].arrivals / 10
    fail = {k: r.summary()["client_failure_rate"] for k, r in runs.items()}
    assert fail["floor"] < fail["deadline"] / 4


def test_rand_and_the_operators_are_untouched() -> None:
    """Admission is a DLB leaf's: Rand's and lr-global's runs are the same with it on."""
    sc, t = batched_scenario(45.0, 60.0), 10.0
    for policy in ("Rand", "lr-global"):
        a = simulate(sc, policy, 0, SimConfig(request_timeout_s=t, admission=False))
        b = simulate(sc, policy, 0, SimConfig(request_timeout_s=t, admission=True))
        assert b.admission_refused == 0
        np.testing.assert_array_equal(a.latency, b.latency)


def test_the_leaf_refuses_with_an_openai_429_at_a_server_that_stopped_finishing() -> None:
    """The real leaf's pick: a server holding ``min_inflight`` of this leaf's requests that finished none in
    a window is refused (429, ``dlb_no_capacity``, retry-after), counted, and holds no record; a server that
    finishes them fast keeps admitting."""
    import json

    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from dlb.core.latency_model import LatencyParams
    from dlb.envoy import contract
    from dlb.ext_proc.leaf import LeafAgent
    from dlb.ext_proc.leaf_state import REFUSED, Completion, LeafState, ServerState

    st = LeafState(cell="c", servers=[ServerState("10.0.0.1:80")], replicas=1, prior=LatencyParams(0.1, 0.01, 4.0, 1.0),
                   rng=np.random.default_rng(0), admission=CFG)
    for k in range(CFG.min_inflight):
        assert st.pick(0.0, f"r{k}") == 0
    assert st.pick(CFG.window_s + 1.0, "late") == REFUSED  # finished none: stuck, whatever its pace
    assert st.admission_refused == 1 and "late" not in st.inflight
    agent = LeafAgent(st)
    req = ep.ProcessingRequest()
    h = req.request_headers.headers.headers.add()
    h.key, h.raw_value = contract.REQUEST_ID, b"x"
    agent.clock = lambda: CFG.window_s + 2.0
    reply, _ = agent.handle(req.SerializeToString())
    assert isinstance(reply, bytes)
    imm = ep.ProcessingResponse.FromString(reply).immediate_response
    assert imm.status.code == 429 and json.loads(imm.body)["error"]["code"] == "dlb_no_capacity"
    assert any(m.header.key == "retry-after" for m in imm.headers.set_headers)
    # Served fast (each finishing 0.1 s after the next is sent), the same server keeps admitting.
    for k in range(CFG.min_inflight):
        st.complete(CFG.window_s + 3.0, Completion(f"r{k}", "10.0.0.1:80", 200, 0.1))
    t = CFG.window_s + 3.0
    for k in range(200):
        t += 0.1
        assert st.pick(t, f"f{k}") == 0
        st.complete(t + 0.05, Completion(f"f{k}", "10.0.0.1:80", 200, 0.05))


def test_the_admission_plugin_reaches_the_leaf_from_the_config_and_over_xds() -> None:
    """``policy.plugins: [{type: admission}]`` turns it on with the endpoints' longest timeout as the deadline,
    in the leaf's starting state and in the LeafPolicy resource the control plane serves."""
    from test_config import minimal

    from dlb.config import config_from_dict
    from dlb.config import resources as dr
    from dlb.ext_proc.leaf_setup import state_from_config

    doc = minimal(policy={"apiVersion": "dlb.v1", "plugins": [{"type": "admission", "parameters": {
        "enabled": True, "fraction": 0.25, "slowdown": 3}}]})
    doc["endpoints"][0]["timeout_s"] = 120
    cfg = config_from_dict(doc)
    want = AdmissionConfig(enabled=True, deadline_s=120.0, fraction=0.25, slowdown=3.0)
    assert state_from_config(cfg, "a", resolve=lambda h, p: [h]).admission == want
    msg = dr.leaf_policy(cfg)
    assert msg.admission_deadline_s == 120.0
    assert dr.leaf_policy_from_pb(msg).admission.to_core(msg.admission_deadline_s) == want
    assert dr.leaf_policy_from_pb(msg) == cfg.policy.leaf
    msg.ClearField("admission_slowdown")  # a control plane from before the floor: its leaves keep the deadline-only rule
    assert dr.leaf_policy_from_pb(msg).admission.slowdown == 0.0


@pytest.mark.parametrize("bad", [-1, 101, "two"])
def test_a_bad_slowdown_names_the_field(bad: object) -> None:
    from test_config import minimal

    from dlb.config import ConfigError, config_from_dict

    doc = minimal(policy={"apiVersion": "dlb.v1", "plugins": [{"type": "admission", "parameters": {"slowdown": bad}}]})
    with pytest.raises(ConfigError, match="slowdown"):
        config_from_dict(doc)


def test_new_admission_settings_keep_what_the_leaf_measured_unless_its_windows_changed() -> None:
    """A new fraction or deadline (config reload, xDS) keeps each server's completion rate and stay floor;
    a new window restarts them, so no decayed count is read under a time constant it was not kept with."""
    from dlb.core.latency_model import LatencyParams
    from dlb.ext_proc.leaf_state import Completion, LeafState, ServerState

    st = LeafState(cell="c", servers=[ServerState("10.0.0.1:80")], replicas=1, prior=LatencyParams(0.1, 0.01, 4.0, 1.0),
                   rng=np.random.default_rng(0), admission=CFG)
    for k in range(CFG.min_inflight):
        assert st.pick(float(k), f"r{k}") == 0
        st.complete(float(k) + 0.5, Completion(f"r{k}", "10.0.0.1:80", 200, 0.5))
    rate = st.servers[0].done_rate
    assert rate is not None and rate.window_s == CFG.window_s
    st.set_admission(replace(CFG, fraction=0.25, deadline_s=120.0))
    assert st.servers[0].done_rate is rate
    st.set_admission(replace(CFG, window_s=30.0))
    assert st.servers[0].done_rate is None and st.servers[0].stay_floor is None
    assert st.pick(20.0, "next") == 0
    assert st.servers[0].done_rate is not None and st.servers[0].done_rate.window_s == 30.0
