"""The data plane end to end with real processes: emulators → leaf Envoys (+ leaf agents) → root
Envoy (+ root ext_proc), two cells ``a`` (the root's own) and ``b`` (25 ms away, WAN-emulated).

Each test states a routing property as observed traffic (which emulator answered, via the
``x-dlb-server`` response header the emulator sets) — never as a timing. Waits for the system to
react (probe staleness, aversion) are bounded polls on the services' own metrics.
"""

from __future__ import annotations

import http.client
import json
import urllib.request

import pytest
from bounded_wait import until as _wait

from dlb.testbed.stack import CellSpec, metric_value, request, start_data_plane

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]

ENDPOINT = {
    "name": "chat",
    "match": {"prefix": "/v1/"},
    "policy": {"mechanism": "discrete", "cost": "latency",
               "aversion": {"enabled": True, "margin": 0.02, "gain": 2.0, "decay": 0.5, "max": 0.9, "period_ms": 200}},
    "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1},
}


#: A flow endpoint (first: its prefix is the more specific one): projected gradient descent on the
#: latency cost moves the routing vector from the replica split toward the local cell (b is 50 ms
#: further away), and the ext_proc samples each request's cell from it.
FLOW = {
    "name": "flow",
    "match": {"prefix": "/v1/completions"},
    "policy": {"mechanism": "flow", "cost": "latency", "flow": {"period_ms": 100, "kappa": 0.5}, "aversion": {"enabled": False}},
    "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1},
}


@pytest.fixture(scope="module")
def plane():
    p = start_data_plane([CellSpec("a"), CellSpec("b")], "a", [FLOW, ENDPOINT], one_way_ms={"a": {"b": 25}})
    try:
        _wait(lambda: metric_value(p.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="b") == 1.0, "both cells usable")
        _wait(lambda: metric_value(p.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0, "both cells usable")
        yield p
    finally:
        p.close()


def _served_by(plane, n: int, headers: dict[str, str] | None = None) -> list[str]:
    host, port = plane.root_url
    out = []
    for _ in range(n):
        status, h, _ = request(host, port, headers=headers)
        out.append(h.get("x-dlb-server", f"status-{status}") if status == 200 else f"status-{status}")
    return out


def _root_view(plane) -> dict[str, dict[str, float | None]]:
    """What the root believes of each cell: the first thing to read when a routing assertion fails."""
    m = plane.root_metrics()
    return {c: {"a_s": metric_value(m, "dlb_root_cell_model", cell=c, param="a_s"),
                "confidence": metric_value(m, "dlb_root_cell_model", cell=c, param="confidence"),
                "rif": metric_value(m, "dlb_root_cell_rif", cell=c),
                "error_rate": metric_value(m, "dlb_root_cell_error_rate", cell=c),
                "aversion": metric_value(m, "dlb_root_aversion_rate", endpoint="chat", cell=c),
                "usable": metric_value(m, "dlb_root_cell_usable", endpoint="chat", cell=c)} for c in ("a", "b")}


def test_requests_go_through_root_and_leaf_to_the_preferred_cell(plane):
    served = _served_by(plane, 12)
    # Latency cost: the local cell has ℓ(N) + 0 and b has ℓ(N) + 50 ms; unloaded, a always wins.
    assert served == ["a-0"] * 12, (served, _root_view(plane))
    root = plane.root_metrics()
    assert metric_value(root, "dlb_root_decisions_total", endpoint="chat", cell="a") >= 12
    assert metric_value(root, "dlb_root_decisions_total", endpoint="chat", cell="b") == 0
    leaf = plane.leaf_metrics("a")
    server = plane.emulators["a"][0].address
    # The leaf ext_proc picked the server and the access log reported the completions back.
    assert metric_value(leaf, "dlb_leaf_server_picks_total", server=server) >= 12
    _wait(lambda: metric_value(plane.leaf_metrics("a"), "dlb_leaf_completed_total") >= 12, "completions via ALS")


def test_streaming_response_arrives_intact_and_incrementally(plane):
    host, port = plane.root_url
    body = {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 300, "stream": True}
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        served = resp.getheader("x-dlb-server")
        first = resp.readline()
        assert first.startswith(b"data: ")
        # The first event is in our hands while the server is still generating: the stream is not
        # buffered anywhere on the way (root Envoy, leaf Envoy).
        emu = {e.server.config.server_id: e for e in plane.emulators["a"] + plane.emulators["b"]}[served]
        with urllib.request.urlopen(f"{emu.admin_url}/admin/state", timeout=5) as r:
            assert json.loads(r.read())["running"] >= 1
        rest = resp.read()
    finally:
        conn.close()
    events = [line[6:] for line in (first + rest).split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0].get("delta", {}).get("content")]
    assert len(text_chunks) == 300
    assert chunks[-1]["choices"][0].get("finish_reason") == "length" or any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)


def test_client_cannot_steer_with_dlb_headers(plane):
    b_server = plane.emulators["b"][0].address
    served = _served_by(plane, 6, headers={"x-dlb-cell": "cell-b", "x-dlb-server": b_server, "x-dlb-src-cell": "b"})
    assert served == ["a-0"] * 6, (served, _root_view(plane))


def test_too_many_headers_is_a_431_error_not_a_bare_500(plane):
    """A client whose headers fit Envoy's limit but not with what the root adds got a bare 500 (the
    ext_proc's mutation rejected); past the limit, Envoy's text/plain 431. Both: a documented 431."""
    host, port = plane.root_url
    seen = set()
    for n in range(78, 112, 2):
        status, hdrs, body = request(host, port, headers={f"x-pad-{i}": "v" for i in range(n)})
        seen.add(status)
        if status != 200:
            assert status == 431, (n, status, body)
            assert hdrs["content-type"] == "application/json", (n, hdrs)
            err = json.loads(body)["error"]
            assert (err["code"], err["type"]) == ("dlb_request_headers_too_large", "invalid_request_error"), (n, err)
            assert "retry-after" not in hdrs
    assert seen == {200, 431}
    admin = plane.root_envoy.admin_port
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=rejected_header_mutations$", timeout=5) as r:
        rejected = int(r.read().decode().rpartition(":")[2])
    assert rejected > 0, "no request hit the window where only the root's own headers overflow"


@pytest.mark.parametrize(("raw", "status"), [
    (b"FOO /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n", 400),  # a method Envoy's codec refuses
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n", 400),
    (b"GET /v1/models HTTP/1.0\r\n\r\n", 426),
])
def test_envoys_protocol_errors_are_openai_shaped(plane, raw: bytes, status: int):
    """Envoy's codec answered these in text/plain; every reply of DLB's own is an OpenAI-shaped error."""
    import socket

    host, port = plane.root_url
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and b"}}" in data:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == str(status).encode(), data
    assert b"content-type: application/json" in head.lower(), data
    err = json.loads(body[body.index(b"{"):body.rindex(b"}") + 1])["error"]
    assert (err["code"], err["type"]) == ("dlb_bad_request", "invalid_request_error"), err


def test_dead_probe_target_is_avoided(plane):
    leaf_a = plane.leaves["a"]
    leaf_a.stop()  # the leaf agent dies; its leaf Envoy still forwards (LEAST_REQUEST fail-open)
    try:
        _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 0.0,
              "root marks cell a unusable")
        assert _served_by(plane, 8) == ["b-0"] * 8
        assert metric_value(plane.root_metrics(), "dlb_root_probe_errors_total", cell="a") >= 1
    finally:
        plane.restart_leaf("a")
    _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0,
          "cell a usable again")
    served = _served_by(plane, 4)
    assert served == ["a-0"] * 4, (served, _root_view(plane))


def test_flow_mechanism_weights_drive_the_split(plane):
    host, port = plane.root_url
    body = {"model": "dlb-emulated", "prompt": "hi", "max_tokens": 4}

    def weight_a() -> float:
        request(host, port, path="/v1/completions", body=body)  # arrivals feed the step size
        return metric_value(plane.root_metrics(), "dlb_root_flow_weight", endpoint="flow", cell="a") or 0.0

    _wait(lambda: weight_a() > 0.9, "flow vector moves to the local cell")
    served = []
    for _ in range(30):
        status, h, _ = request(host, port, path="/v1/completions", body=body)
        assert status == 200
        served.append(h["x-dlb-server"])
    # x_a > 0.9 (and still rising): 20 of 30 is far in the tail of Binomial(30, 0.9).
    assert served.count("a-0") >= 20, served
    root = plane.root_metrics()
    assert metric_value(root, "dlb_root_decisions_total", endpoint="flow", cell="a") >= 20


def test_dead_leaf_envoy_is_avoided_although_its_agent_answers(plane):
    """The control path (probes) is up, the data path (leaf Envoy) is down: the leaf agent's own check
    of its Envoy makes probes fail, so roots stop sending there."""
    envoy_a = plane.leaf_envoys["a"]
    envoy_a.stop()
    try:
        _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 0.0,
              "root marks cell a unusable")
        assert metric_value(plane.leaf_metrics("a"), "dlb_leaf_envoy_reachable") == 0.0
        assert _served_by(plane, 6) == ["b-0"] * 6
    finally:
        envoy_a.start()
    _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0,
          "cell a usable again")
    served = _served_by(plane, 4)
    assert served == ["a-0"] * 4, (served, _root_view(plane))


# Last: it leaves cell a with a decaying error rate (and aversion) behind.
def test_error_aversion_moves_traffic_away_from_a_failing_cell(plane):
    emu_a = plane.emulators["a"][0]
    emu_a.set_faults(error_rate=1.0, error_status=500)
    try:
        host, port = plane.root_url

        def averse() -> bool:
            request(host, port)  # keep traffic flowing so the leaf sees the errors
            v = metric_value(plane.root_metrics(), "dlb_root_aversion_rate", endpoint="chat", cell="a")
            return v is not None and v >= 0.5

        _wait(averse, "root averts cell a")
        served = _served_by(plane, 40)
        # a_max = 0.9: ~90% skip a. 24 of 40 is far in the tail of Binomial(40, 0.9) (P < 1e-6).
        assert served.count("b-0") >= 24, served
        leaf = plane.leaf_metrics("a")
        assert metric_value(leaf, "dlb_leaf_error_rate") > 0.1 >= metric_value(plane.leaf_metrics("b"), "dlb_leaf_error_rate")
    finally:
        emu_a.set_faults(error_rate=0.0)


def _completed_from(plane, cell: str) -> dict[str, int]:
    import grpc

    from dlb.proto import probe_pb2, probe_pb2_grpc

    with grpc.insecure_channel(str(plane.cfg.cell(cell).leaf.probe)) as ch:
        r = probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(source_cell="test"), timeout=5)
    return dict(r.completed_by_source)


def test_leaf_counts_a_source_cell_only_from_roots(plane):
    """A client at leaf b's port claiming to come from cell a is not counted as a's demand (issue 14 row 9);
    the same request with the roots' token is (the access log sees what the leaf's routes kept)."""
    from dlb.envoy.contract import ROOT_TOKEN, SRC_CELL
    from dlb.envoy.root_token import root_token

    leaf = plane.cfg.cell("b").leaf.address
    before = _completed_from(plane, "b").get("a", 0)
    for _ in range(3):
        assert request(leaf.host, leaf.port, headers={SRC_CELL: "a", ROOT_TOKEN: "not-the-token-0123456789"})[0] == 200
    assert request(leaf.host, leaf.port, headers={SRC_CELL: "a", ROOT_TOKEN: root_token(plane.cfg)})[0] == 200
    # One Envoy worker (EnvoyProcess.concurrency = 1): one access-log stream, records in request order.
    _wait(lambda: _completed_from(plane, "b").get("a", 0) >= before + 1, "the root-token request counted")
    assert _completed_from(plane, "b").get("a", 0) == before + 1
