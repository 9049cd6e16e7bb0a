"""The leaf-held queue on the real data path: a real leaf Envoy, the leaf agent as its ext_proc and a DP
emulator whose ranks report their admission bound (``dlb_dp_max_num_seqs``); the config gives none.

Each rank admits one running request. With both ranks busy, further requests are held by the leaf (the
ext_proc reply is delayed, Envoy's message timer extended), released to the rank that frees when a
stream ends, refused with an OpenAI-shaped 429 past the queue's length and answered 503 past the deadline.
"""

from __future__ import annotations

import http.client
import json
import threading

import pytest
from bounded_wait import until

from dlb.bench.bfio_dataplane import dp_cell

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]


class Stream:
    """A streaming completion; ``open()`` blocks until its response starts (so a held one blocks)."""

    def __init__(self, host: str, port: int, tokens: int = 3000) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        self.body = json.dumps({"model": "dlb-emulated", "prompt": "x" * 400, "max_tokens": tokens, "stream": True})
        self.status = -1
        self.server = ""
        self.error: dict | None = None
        self.retry_after: str | None = None

    def open(self) -> Stream:
        self.conn.request("POST", "/v1/completions", body=self.body, headers={"content-type": "application/json"})
        resp = self.conn.getresponse()
        self.status, self.server = resp.status, resp.getheader("x-dlb-server") or ""
        if resp.status == 200:
            assert resp.readline().startswith(b"data: ")
        else:
            self.retry_after = resp.getheader("retry-after")
            self.error = json.loads(resp.read())["error"]
        return self

    def open_in_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.open, daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.conn.close()


def metric(text: str, prefix: str, having: str = "") -> float:
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(prefix) and having in line)


def test_held_requests_are_released_to_the_freed_rank_and_refused_past_the_bounds() -> None:
    with dp_cell("bf-io", dp_size=2, max_batch=1, time_scale=5.0, background_probes=False,
                 hold_queue=2, hold_deadline_ms=4000) as cell:  # fmt: skip
        host, port = cell.leaf
        # The bound is the ranks' own: wait until the leaf has scraped both ranks.
        until(lambda: not [line for line in cell.leaf_metrics().splitlines()
                           if line.startswith("dlb_leaf_server_scraped_load{") and line.endswith(" -1.0")],
              "leaf scraped both ranks")
        streams = [Stream(host, port).open(), Stream(host, port).open()]
        held = [Stream(host, port), Stream(host, port)]
        try:
            assert sorted(s.server for s in streams) == ["dp-dp0", "dp-dp1"]
            threads = []
            for n, s in enumerate(held, 1):  # one at a time: the arrival order is the test's
                threads.append(s.open_in_thread())
                until(lambda n=n: metric(cell.leaf_metrics(), "dlb_leaf_dp_held{") == n, f"{n} requests held")
            assert all(s.status == -1 for s in held)  # no answer yet: Envoy waits on the ext_proc
            full = Stream(host, port).open()
            assert full.status == 429 and full.retry_after == "1"
            assert full.error is not None and full.error["code"] == "dlb_no_capacity"
            # One rank frees: the oldest held request goes there, the other still waits.
            freed = streams[0].server
            streams[0].close()
            threads[0].join(30)
            assert held[0].status == 200 and held[0].server == freed and held[1].status == -1
            streams[1].close()
            threads[1].join(30)
            assert held[1].status == 200 and held[1].server == streams[1].server
            # Both ranks busy again: one more is held and answered 503 at the 4 s deadline.
            late = Stream(host, port).open()
            assert late.status == 503 and late.error is not None and late.error["code"] == "dlb_no_capacity"
            text = cell.leaf_metrics()
            outcomes = {o: metric(text, "dlb_leaf_dp_hold_outcomes_total{", f'outcome="{o}"') for o in ("released", "full", "deadline")}
            assert outcomes == {"released": 2.0, "full": 1.0, "deadline": 1.0}, outcomes
        finally:
            for s in streams + held:
                s.close()
