"""The leaf agent behind a real leaf Envoy, in both modes:

- with a leaf ext_proc, the agent picks the server (``x-dlb-server`` → ORIGINAL_DST) and spreads
  concurrent requests over the servers by the RIF it counts at pick time;
- without one (Envoy ``LEAST_REQUEST`` picks), the agent still counts RIF from the access log's
  request-start entries, and completions release it.

The probe service is read over gRPC exactly as a root reads it.
"""

from __future__ import annotations

import http.client
import json

import grpc
import pytest
from bounded_wait import until as _wait

from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.testbed.stack import CellSpec, metric_value, request, start_data_plane

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]

ENDPOINT = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
            "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1}}


def probe(plane, cell: str) -> probe_pb2.ProbeResponse:
    with grpc.insecure_channel(str(plane.cfg.cell(cell).leaf.probe)) as ch:
        return probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(source_cell="test"), timeout=5)


class Stream:
    """A streaming completion held open: read the first event, finish later."""

    def __init__(self, host: str, port: int, tokens: int = 400, content: str = "hi") -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        body = {"model": "dlb-emulated", "messages": [{"role": "user", "content": content}], "max_tokens": tokens, "stream": True}
        self.conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200
        self.server = self.resp.getheader("x-dlb-server")
        assert self.resp.readline().startswith(b"data: ")

    def finish(self) -> bytes:
        try:
            return self.resp.read()
        finally:
            self.conn.close()


@pytest.mark.parametrize("leaf_ext_proc", [True, False], ids=["leaf-ext-proc", "least-request"])
def test_leaf_counts_rif_and_completions(leaf_ext_proc):
    plane = start_data_plane([CellSpec("a", servers=2)], "a", ENDPOINT, leaf_ext_proc=leaf_ext_proc)
    try:
        _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0, "cell usable")
        host, port = plane.root_url
        streams = [Stream(host, port) for _ in range(4)]
        try:
            # All four are mid-generation: the leaf reports them in flight (picked, or seen starting in the log).
            _wait(lambda: probe(plane, "a").rif == 4, "probe reports 4 in flight")
            servers = sorted(s.server for s in streams)
            if leaf_ext_proc:
                # RIF counted at pick time → join-the-shortest-queue over 2 servers: 2 and 2.
                assert servers == ["a-0", "a-0", "a-1", "a-1"]
                leaf = plane.leaf_metrics("a")
                assert sum(metric_value(leaf, "dlb_leaf_server_rif", server=e.address) for e in plane.emulators["a"]) == 4
                # The picks came over the HTTP/2 transport (the leaf ext_proc has its own address).
                assert metric_value(leaf, "dlb_leaf_h2_messages_total") >= 4
        finally:
            bodies = [s.finish() for s in streams]
        assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies)
        _wait(lambda: probe(plane, "a").rif == 0, "completions release RIF")
        for _ in range(6):
            assert request(host, port)[0] == 200
        _wait(lambda: probe(plane, "a").completed >= 10, "ALS completions counted")
        p = probe(plane, "a")
        assert p.cell == "a" and p.replicas == 2 and p.healthy_replicas == 2 and p.errors == 0
        assert p.error_rate == 0.0 and p.timestamp_unix_ns > 0 and p.HasField("model") and p.model.a_s > 0
        assert p.waiting >= 0  # scraped from the emulators' vLLM gauges
    finally:
        plane.close()


def test_leaf_ext_proc_avoids_a_server_busy_with_traffic_it_did_not_send():
    """Scraped vLLM gauges show work that bypassed the leaf; the picker steers around it."""
    plane = start_data_plane([CellSpec("a", servers=2)], "a", ENDPOINT, leaf_ext_proc=True)
    try:
        _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0, "cell usable")
        busy = plane.emulators["a"][0]
        host, port = busy.address.rsplit(":", 1)
        direct = [Stream(host, int(port), tokens=2000) for _ in range(6)]  # straight to a-0, not via the leaf
        try:
            _wait(lambda: (metric_value(plane.leaf_metrics("a"), "dlb_leaf_server_scraped_load", server=busy.address) or 0) >= 6,
                  "leaf scrapes the busy server's queue")
            rh, rp = plane.root_url
            served = [request(rh, rp)[1].get("x-dlb-server") for _ in range(5)]
            assert served == ["a-1"] * 5
        finally:
            for s in direct:
                s.conn.close()
    finally:
        plane.close()


def test_leaf_balances_tokens_waiting_not_request_counts():
    """Prequal pick (the leaf's default): a 16 kB prompt (≈ 4 k tokens by its content-length) in flight on
    one server outweighs three short chats, so all three go to the other server. The RIF rule cannot do
    this: after one short request each server has one in flight and the next is a coin toss, the one
    after goes back to the long prompt's server."""
    plane = start_data_plane([CellSpec("a", servers=2)], "a", ENDPOINT, leaf_ext_proc=True)
    try:
        _wait(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0, "cell usable")
        host, port = plane.root_url
        long = Stream(host, port, tokens=2000, content="lorem ipsum " * 1400)
        streams = [long]
        try:
            for _ in range(3):
                streams.append(Stream(host, port, tokens=2000))
            assert long.server is not None
            leaf = plane.leaf_metrics("a")
            tokens = {f"a-{k}": metric_value(leaf, "dlb_leaf_server_tokens", server=e.address) for k, e in enumerate(plane.emulators["a"])}
            assert tokens[long.server] > 4000, tokens  # the leaf read the size from content-length
            assert [s.server for s in streams[1:]] == [({"a-0", "a-1"} - {long.server}).pop()] * 3
        finally:
            for s in streams:
                s.conn.close()
    finally:
        plane.close()
