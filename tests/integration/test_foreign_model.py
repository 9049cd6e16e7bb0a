"""A foreign vLLM cell's latency model, fitted by the root's prober from real ``/metrics`` scrapes over
real sockets (a vLLM-shaped HTTP server in-process, the root's :class:`ProbeClient`).

Rules: the answer carries a model fitted from the server's ``vllm:e2e_request_latency_seconds``; when
the cell's requests take 5× longer, the fitted latency at the cell's RIF follows within seconds; a
server that exports no latency histogram leaves the model at confidence 0 (the root keeps its prior).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from bounded_wait import until_in_loop

from dlb.core.latency_model import LatencyParams, latency
from dlb.probe.client import ProbeClient, ProbeTiming
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2

pytestmark = pytest.mark.timeout(120)

PRIOR = LatencyParams(1.0, 0.05, 8.0, 1.0)
RIF = 6.0


class Cell:
    """A vLLM server's ``/metrics``: RIF constant, two requests of ``latency_s`` completed per scrape."""

    def __init__(self, histogram: bool = True) -> None:
        self.latency_s, self.histogram = 1.0, histogram
        self.total, self.count = 0.0, 0
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            self.total += 2 * self.latency_s
            self.count += 2
            lines = [f'vllm:num_requests_running{{model_name="m"}} {RIF - 1}', 'vllm:num_requests_waiting{model_name="m"} 1']
            if self.histogram:
                lines += [f'vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {self.total}',
                          f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {self.count}']
        return ("\n".join(lines) + "\n").encode()


@contextmanager
def serving(cell: Cell) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = cell.render()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        srv.server_close()


def fitted(resp: probe_pb2.ProbeResponse | None) -> float:
    """The answer's model's latency at the cell's RIF, 0 until it carries one with confidence."""
    if resp is None or resp.model.confidence <= 0:
        return 0.0
    m = resp.model
    return float(latency(resp.rif, m.a_s, m.b_s, m.c, m.s))


async def _probe(address: str) -> ProbeClient:
    target = ProbeTarget(0, "partner", address, source="vllm", scrape=(address,))
    client = ProbeClient([target], lambda *_: None, ProbeTiming(period_s=0.1, timeout_s=1.0), prior_of=lambda _: PRIOR)
    client.start()
    return client


def test_the_fitted_latency_follows_a_slowed_foreign_cell() -> None:
    cell = Cell()

    async def scenario() -> tuple[float, float]:
        with serving(cell) as address:
            client = await _probe(address)
            try:
                await until_in_loop(lambda: 0.8 < fitted(client.cell_last.get(0)) < 1.25, "model at ~1 s", timeout=30)
                fast = fitted(client.cell_last[0])
                cell.latency_s = 5.0
                await until_in_loop(lambda: fitted(client.cell_last.get(0)) > 3.5, "model follows the 5x slowdown", timeout=40)
                return fast, fitted(client.cell_last[0])
            finally:
                await client.stop()

    fast, slow = asyncio.run(scenario())
    assert slow > 3.0 * fast


def test_without_a_latency_histogram_the_model_stays_at_confidence_0() -> None:
    cell = Cell(histogram=False)

    async def scenario() -> probe_pb2.ProbeResponse:
        with serving(cell) as address:
            client = await _probe(address)
            try:
                await until_in_loop(lambda: client.stats[(0, 0)].ok >= 20, "20 answers", timeout=30)
                return client.cell_last[0]
            finally:
                await client.stop()

    resp = asyncio.run(scenario())
    assert resp.rif == RIF and resp.HasField("model") and resp.model.confidence == 0.0 and resp.model.samples == 0
