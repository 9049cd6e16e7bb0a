"""Root ext_proc service: decisions on real ext_proc protobufs, over a real gRPC stream, and the
probe client against real (in-process) leaf agents, including dead and mis-addressed ones."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.config import config_from_dict
from dlb.ext_proc.root import EndpointSpec, RootService
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2

pytestmark = pytest.mark.timeout(60)


def config(affinity: bool = False, cost: str = "latency", aversion: bool = False):
    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate(["a", "b"])]
    policy = {"mechanism": "discrete", "cost": cost, "aversion": {"enabled": aversion}}
    if affinity:
        policy["affinity"] = {"enabled": True, "header": "x-session-id", "prefix_savings_ms": 1000}
    return config_from_dict({
        "version": 1, "cells": cells, "network": {"one_way_ms": {"a": {"b": 20}}},
        "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": policy,
                       "latency_prior": {"a_s": 0.1, "b_s": 0.01, "c": 4, "s": 1}}],
    })


def headers_msg(path: str = "/v1/chat/completions", **extra: str) -> ep.ProcessingRequest:
    hs = [(":path", path), (":method", "POST"), ("x-request-id", "r1"), *[(k.replace("_", "-"), v) for k, v in extra.items()]]
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs])))


def set_headers(raw: bytes) -> dict[str, str]:
    resp = ep.ProcessingResponse.FromString(raw)
    assert resp.WhichOneof("response") == "request_headers", resp
    common = resp.request_headers.response
    assert common.clear_route_cache
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def probe(svc: RootService, cell: int, now: float, rif: float = 0.0, err: float = 0.0, capacity: float | None = None) -> None:
    name = svc.cell_names[cell]
    svc.on_probe(ProbeTarget(cell, name, ""), probe_pb2.ProbeResponse(
        cell=name, rif=rif, error_rate=err, model=probe_pb2.LatencyModel(a_s=0.1, b_s=0.01, c=4, s=1, confidence=1),
        capacity=capacity), now)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def service(**kw) -> tuple[RootService, Clock]:
    svc = RootService.from_config(config(**kw), "a", seed=3)
    clock = Clock()
    svc.clock = clock
    return svc, clock


def test_decision_sets_cell_fallback_and_source_headers():
    svc, clock = service()
    probe(svc, 0, clock.t)
    probe(svc, 1, clock.t)
    h = set_headers(svc.decide(headers_msg().request_headers.headers.headers))
    # b is the only other usable cell: the root Envoy retries there if a's connection fails
    assert h == {"x-dlb-cell": "cell-a", "x-dlb-fallback-cell": "cell-b", "x-dlb-src-cell": "a"}
    assert svc.endpoints[0].decisions == [1, 0]


def test_one_usable_cell_still_falls_back_on_another_allowed_cell():
    """b's probe answers are late (stale), as on a starved root: a is the only usable cell, and a request
    refused by a's dead leaf Envoy must still get its one retry, on b, not a 503."""
    svc, clock = service()
    probe(svc, 0, clock.t)
    probe(svc, 1, clock.t - 5.0)  # answered, but long ago: not usable, yet allowed
    h = set_headers(svc.decide(headers_msg().request_headers.headers.headers))
    assert h == {"x-dlb-cell": "cell-a", "x-dlb-fallback-cell": "cell-b", "x-dlb-src-cell": "a"}


def test_load_moves_the_decision_and_spoofed_headers_are_ignored():
    svc, clock = service()
    probe(svc, 0, clock.t, rif=50)  # local cell deep past its knee: ℓ ≈ 0.1 + 0.46 s ≫ 40 ms RTT
    probe(svc, 1, clock.t, rif=0)
    msg = headers_msg(x_dlb_cell="cell-a", x_dlb_src_cell="a")
    assert set_headers(svc.decide(msg.request_headers.headers.headers))["x-dlb-cell"] == "cell-b"


def test_no_fresh_probe_state_gives_503_and_unknown_path_404():
    svc, clock = service()
    probe(svc, 0, clock.t)
    clock.t += 5.0  # stale (stale_after 1 s by default)
    resp = ep.ProcessingResponse.FromString(svc.decide(headers_msg().request_headers.headers.headers))
    assert resp.immediate_response.status.code == 503 and b"no usable cell" in resp.immediate_response.body
    resp = ep.ProcessingResponse.FromString(svc.decide(headers_msg(path="/other").request_headers.headers.headers))
    assert resp.immediate_response.status.code == 404
    assert svc.unmatched == 1 and svc.endpoints[0].rejected == 1


def test_a_started_root_routes_before_its_first_probe_answer_but_not_to_a_dead_cell():
    """Warm start: no 503 while no probe has answered yet; a cell whose probes failed is not used."""
    svc, clock = service()
    cells = {set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] for _ in range(60)}
    assert cells == {"cell-a", "cell-b"} and svc.endpoints[0].rejected == 0  # replicas 1:1
    svc.on_probe(ProbeTarget(1, "b", ""), None, clock.t)  # b's leaf: consecutive probe failures
    cells = {set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] for _ in range(60)}
    assert cells == {"cell-a"}


def test_dlb_own_replies_are_openai_shaped_errors_with_retry_after_where_it_helps():
    """An OpenAI SDK shows ``error.message``/``code`` from a JSON body and retries 5xx honouring retry-after."""
    import json

    svc, _ = service()

    def reply(path: str) -> tuple[int, dict[str, str], dict]:
        imm = ep.ProcessingResponse.FromString(svc.decide(headers_msg(path=path).request_headers.headers.headers)).immediate_response
        hdrs = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
        return imm.status.code, hdrs, json.loads(imm.body)

    probe(svc, 0, svc.clock())
    svc.clock = lambda: 1e9  # that probe is long stale, and no other cell answered: no usable cell
    code, hdrs, body = reply("/v1/chat/completions")
    assert code == 503 and hdrs["content-type"] == "application/json" and hdrs["retry-after"] == "1"
    assert set(body) == {"error"} and body["error"]["code"] == "dlb_no_capacity"
    assert body["error"]["type"] == "service_unavailable" and "no usable cell" in body["error"]["message"]
    code, hdrs, body = reply("/other")
    assert code == 404 and hdrs["content-type"] == "application/json" and "retry-after" not in hdrs
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "dlb_no_endpoint"


def test_a_restarted_leafs_prior_does_not_replace_the_learned_model():
    svc, clock = service()
    router = svc.endpoints[0].router
    learned = probe_pb2.LatencyModel(a_s=0.03, b_s=0.004, c=6, s=1, confidence=0.8)
    svc.on_probe(ProbeTarget(0, "a", ""), probe_pb2.ProbeResponse(cell="a", model=learned), clock.t)
    assert router.models.a[0] == pytest.approx(0.03)
    prior = probe_pb2.LatencyModel(a_s=0.5, b_s=0.05, c=4, s=1, confidence=0.0)  # the leaf restarted
    svc.on_probe(ProbeTarget(0, "a", ""), probe_pb2.ProbeResponse(cell="a", model=prior), clock.t)
    assert router.models.a[0] == pytest.approx(0.03) and router.view.confidence[0] == pytest.approx(0.8)
    relearned = probe_pb2.LatencyModel(a_s=0.04, b_s=0.004, c=6, s=1, confidence=0.3)  # its own fit takes over
    svc.on_probe(ProbeTarget(0, "a", ""), probe_pb2.ProbeResponse(cell="a", model=relearned), clock.t)
    assert router.models.a[0] == pytest.approx(0.04)


def test_failed_probe_verdict_removes_cell_at_once():
    svc, clock = service()
    probe(svc, 0, clock.t)
    probe(svc, 1, clock.t)
    svc.on_probe(ProbeTarget(0, "a", ""), None, clock.t)
    assert set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] == "cell-b"


def test_a_cell_reporting_zero_healthy_servers_is_unusable_until_one_is_back():
    """healthy_replicas = 0 means "every server is down", not "not reported": the cell must get nothing."""
    svc, clock = service()
    probe(svc, 1, clock.t)
    svc.on_probe(ProbeTarget(0, "a", ""), probe_pb2.ProbeResponse(cell="a", rif=0, healthy_replicas=0), clock.t)
    picks = {set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] for _ in range(50)}
    assert picks == {"cell-b"}  # a (local, idle) would win every pick if it were usable
    svc.on_probe(ProbeTarget(1, "b", ""), probe_pb2.ProbeResponse(cell="b", rif=0, healthy_replicas=0), clock.t)
    resp = ep.ProcessingResponse.FromString(svc.decide(headers_msg().request_headers.headers.headers))
    assert resp.immediate_response.status.code == 503
    # A leaf that does not report the field (older agent) stays usable; one server back makes it usable.
    svc.on_probe(ProbeTarget(1, "b", ""), probe_pb2.ProbeResponse(cell="b", rif=0), clock.t)
    svc.on_probe(ProbeTarget(0, "a", ""), probe_pb2.ProbeResponse(cell="a", rif=0, healthy_replicas=1), clock.t)
    picks = {set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] for _ in range(50)}
    assert "cell-a" in picks


def test_aversion_decays_as_soon_as_the_cells_errors_stop():
    """The leaf's error EMA lingers after a cell recovers; its error counter does not, and aversion follows it."""
    svc, clock = service(aversion=True)
    router = svc.endpoints[0].router
    errors = 0

    def both(err_a: float) -> None:
        svc.on_probe(ProbeTarget(0, "a", ""), probe_pb2.ProbeResponse(cell="a", error_rate=err_a, errors=errors), clock.t)
        svc.on_probe(ProbeTarget(1, "b", ""), probe_pb2.ProbeResponse(cell="b", error_rate=0.0), clock.t)
        svc.tick(clock.t)

    for _ in range(10):  # cell a failing: its counter rises every period
        errors += 5
        both(0.5)
        clock.t += 1.0
    high = float(router.aversion[0])
    assert high > 0.5
    for _ in range(6):  # errors stopped; the EMA the leaf reports is still 0.5
        both(0.5)
        clock.t += 1.0
    assert router.aversion[0] < 0.1 * high
    errors += 1  # a new error: the EMA counts again — one period adds gain · gap (0.5 · 0.48)
    low = float(router.aversion[0])
    both(0.5)
    assert router.aversion[0] > low + 0.2


def test_session_affinity_from_configured_header():
    svc, clock = service(affinity=True)
    probe(svc, 0, clock.t, rif=50)
    probe(svc, 1, clock.t, rif=0)
    first = set_headers(svc.decide(headers_msg(x_session_id="s1").request_headers.headers.headers))["x-dlb-cell"]
    assert first == "cell-b"
    # Now b is the loaded one; the session stays (prefix savings 1 s outweigh the cost gap) ...
    probe(svc, 0, clock.t, rif=0)
    probe(svc, 1, clock.t, rif=50)
    again = set_headers(svc.decide(headers_msg(x_session_id="s1").request_headers.headers.headers))["x-dlb-cell"]
    assert again == "cell-b"
    # ... while a new session goes to the cheap cell.
    other = set_headers(svc.decide(headers_msg(x_session_id="s2").request_headers.headers.headers))["x-dlb-cell"]
    assert other == "cell-a"


def test_a_failing_decision_continues_on_the_fail_open_route():
    svc, clock = service()
    probe(svc, 0, clock.t)

    def broken(now, session=None):
        raise FloatingPointError("boom")

    svc.endpoints[0].router.pick = broken

    out, end = svc.handle(headers_msg().SerializeToString())
    resp = ep.ProcessingResponse.FromString(out)
    # An empty request-headers reply: no x-dlb-cell, so the root Envoy routes by its fallback weights.
    assert resp.WhichOneof("response") == "request_headers"
    assert not resp.request_headers.response.header_mutation.set_headers
    assert end and svc.errors == 1


def test_residency_root_never_leaves_its_allowed_cells():
    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate(["us", "eu", "ap"])]
    cfg = config_from_dict({
        "version": 1, "cells": cells,
        "network": {"default_one_way_ms": 10, "allowed": {"eu": ["eu"]}},
        "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"cost": "rif", "aversion": {"enabled": False}}}],
    })
    svc = RootService.from_config(cfg, "eu", seed=1)
    clock = Clock()
    svc.clock = clock
    for j in range(3):
        probe(svc, j, clock.t, rif=100.0 if j == 1 else 0.0)  # eu is swamped, the others idle
    picks = {set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] for _ in range(20)}
    assert picks == {"cell-eu"}
    svc.on_probe(ProbeTarget(1, "eu", ""), None, clock.t)  # eu's leaf is gone: nowhere legal to go
    resp = ep.ProcessingResponse.FromString(svc.decide(headers_msg().request_headers.headers.headers))
    assert resp.immediate_response.status.code == 503


def test_sends_no_probe_has_seen_survive_a_reconfiguration():
    cfg = config(cost="rif")
    svc = RootService.from_config(cfg, "a", seed=3)
    clock = Clock()
    svc.clock = clock
    for j in range(2):
        probe(svc, j, clock.t)
    for _ in range(6):
        svc.decide(headers_msg().request_headers.headers.headers)
    before = svc.endpoints[0].router.view.sent.copy()
    assert before.sum() == 6
    # A hot reload (same cells) builds new routers; then probes sent before the requests answer.
    specs = [EndpointSpec(e.name, e.match.prefix, e.policy.to_core(cfg.probe), e.latency_prior.to_core()) for e in cfg.endpoints]
    svc.configure(cfg.topology(), specs)
    clock.t += 1e-3  # well inside b's 40-ms round trip: its answer cannot include the requests
    probe(svc, 1, clock.t)
    assert before[1] > 0 and svc.endpoints[0].router.view.sent[1] == before[1]


def test_every_cell_saturated_gives_429_with_a_drain_time_retry_after_and_counts_it():
    """Shedding (dlb.core.shedding): both cells' buffers full → 429 dlb_no_capacity, retry-after = the
    shortest ℓ_j(N_j) rounded up (ℓ(40) = 0.1 + 0.01·(40 − 4 + softplus) ≈ 0.46 s → the 1-s floor;
    ℓ(400) ≈ 4.06 s → 5); one cell with room → routed there."""
    import json

    svc, clock = service()
    probe(svc, 0, clock.t, rif=40, capacity=40)
    probe(svc, 1, clock.t, rif=400, capacity=400)
    imm = ep.ProcessingResponse.FromString(svc.decide(headers_msg().request_headers.headers.headers)).immediate_response
    hdrs = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
    body = json.loads(imm.body)
    assert imm.status.code == 429 and hdrs["retry-after"] == "1" and hdrs["content-type"] == "application/json"
    assert body["error"]["code"] == "dlb_no_capacity" and body["error"]["type"] == "service_unavailable"
    assert svc.endpoints[0].shed == 1 and svc.endpoints[0].rejected == 0
    clock.t += 0.3  # past the reply's reuse time; cell a drained, b still full
    probe(svc, 0, clock.t, rif=10, capacity=40)
    probe(svc, 1, clock.t, rif=400, capacity=400)
    assert set_headers(svc.decide(headers_msg().request_headers.headers.headers))["x-dlb-cell"] == "cell-a"
    svc2, clock2 = service()
    probe(svc2, 0, clock2.t, rif=400, capacity=400)
    probe(svc2, 1, clock2.t, rif=400, capacity=400)
    imm = ep.ProcessingResponse.FromString(svc2.decide(headers_msg().request_headers.headers.headers)).immediate_response
    assert imm.status.code == 429 and {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}["retry-after"] == "5"
    shed = [m for m in svc2.collect() if m.name == "dlb_root_shed"][0]
    assert [(s.labels, s.value) for s in shed.samples] == [({"endpoint": "chat", "source_cell": "a"}, 1.0)]


def test_sheds_are_logged_at_most_once_per_period_with_their_count() -> None:
    """Not one log line per shed: a root shedding thousands of requests a second writes one line per
    endpoint every SHED_LOG_EVERY_S, carrying how many it shed since the last."""
    from structlog.testing import capture_logs

    from dlb.ext_proc.root import SHED_LOG_EVERY_S

    svc, clock = service()
    with capture_logs() as logs:
        for _ in range(3):
            for j in (0, 1):
                probe(svc, j, clock.t, rif=40, capacity=40)
            for _ in range(100):
                svc.decide(headers_msg().request_headers.headers.headers)
            clock.t += SHED_LOG_EVERY_S / 2
    lines = [e for e in logs if e["event"] == "requests_shed"]
    assert svc.endpoints[0].shed == 300 and [e["shed"] for e in lines] == [1, 200], lines
