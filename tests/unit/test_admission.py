"""Leaf admission (:mod:`dlb.core.admission`): a leaf refuses a request its server would, by Little's law,
keep past a share of the client's deadline, and the simulator's DLB leaves do so under overload."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dlb.core.admission import AdmissionConfig, CompletionRate, admits
from dlb.sim.engine import SimConfig, simulate
from tests.unit.test_sim_engine import batched_scenario

CFG = AdmissionConfig(enabled=True, deadline_s=60.0, fraction=0.5)  # target 30 s, window 10 s, at least 8 in flight


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
    """At 5 completions/s a server holding n stays (n + 1)/5 s: below 30 s it admits, from 30 s it refuses."""
    r = _served(5.0, 60.0)
    assert admits(100, r, 60.0, CFG)  # 20 s
    assert not admits(155, r, 60.0, CFG)  # 31 s
    assert not admits(400, r, 60.0, CFG)


def test_guards_admit_a_quiet_server_a_new_one_and_everything_when_off() -> None:
    idle = CompletionRate(0.0, CFG.window_s)  # nothing finished yet
    assert admits(CFG.min_inflight - 1, idle, 60.0, CFG)  # too few in flight to judge
    assert admits(500, idle, CFG.window_s - 1.0, CFG)  # watched for less than a window
    assert not admits(CFG.min_inflight, idle, 60.0, CFG)  # a window with nothing finished: stuck
    assert admits(500, idle, 60.0, AdmissionConfig(enabled=False, deadline_s=60.0))
    assert admits(500, idle, 60.0, AdmissionConfig(enabled=True))  # no deadline: never


@pytest.mark.parametrize(("field", "value"), [("deadline_s", 0.0), ("fraction", 0.0), ("fraction", 1.5),
                                              ("window_s", 0.0), ("min_inflight", 0)])
def test_bad_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        AdmissionConfig(**{field: value})


def test_an_overloaded_batched_server_serves_more_in_time_when_its_leaf_refuses_early() -> None:
    """One batched server at ~1.5x its rate for a minute, 10-s timeout, a DLB root (Disc-RIF). Without
    admission every admitted request slows the batch until most are cancelled in service; with it the
    leaf refuses what would stay past a third of it, so more requests are answered in time and fewer fail."""
    sc, t = batched_scenario(45.0, 60.0), 10.0
    off = simulate(sc, "Disc-RIF", 0, SimConfig(request_timeout_s=t, admission=False))
    on = simulate(sc, "Disc-RIF", 0, SimConfig(request_timeout_s=t, admission=True))
    assert off.admission_refused == 0 and on.admission_refused > 0
    assert on.shed >= on.admission_refused
    in_time = [int(np.count_nonzero(r.latency <= t)) for r in (off, on)]
    assert in_time[1] > 1.1 * in_time[0]
    assert on.cancelled < off.cancelled / 5  # the work goes to requests that finish, not to ones cut at the timeout
    fail = [r.summary()["client_failure_rate"] for r in (off, on)]
    assert fail[1] < fail[0]
    assert on.summary()["mean_latency_with_failures"] < off.summary()["mean_latency_with_failures"]
    assert on.completed + on.errors + on.shed + on.cancelled + on.in_flight == on.arrivals
    assert on.rif_end.tolist() == [0]


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
    assert st.pick(CFG.window_s + 1.0, "late") == REFUSED
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

    doc = minimal(policy={"apiVersion": "dlb.v1", "plugins": [{"type": "admission", "parameters": {"enabled": True, "fraction": 0.25}}]})
    doc["endpoints"][0]["timeout_s"] = 120
    cfg = config_from_dict(doc)
    want = AdmissionConfig(enabled=True, deadline_s=120.0, fraction=0.25)
    assert state_from_config(cfg, "a", resolve=lambda h, p: [h]).admission == want
    msg = dr.leaf_policy(cfg)
    assert msg.admission_deadline_s == 120.0
    assert dr.leaf_policy_from_pb(msg).admission.to_core(msg.admission_deadline_s) == want
    assert dr.leaf_policy_from_pb(msg) == cfg.policy.leaf
