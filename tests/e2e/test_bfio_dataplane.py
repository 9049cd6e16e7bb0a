"""BF-IO on the real data path: a DP emulator (``--dp-size``), the leaf agent as the leaf Envoy's
ext_proc, and a real leaf Envoy routing each request to the rank the group's policy picked.

The scenario separates the policies: a request with a huge prompt and one with a tiny prompt are
held open (streaming) on the two ranks, so both ranks hold one request. JSQ sees a tie in counts and
takes the first rank (the heavy one); BF-IO sees the predicted workload and takes the light one.
"""

from __future__ import annotations

import http.client
import json

import pytest
from bounded_wait import until as _until

from dlb.bench.bfio_dataplane import dp_cell, drive, rank_totals, streamed_tokens, workload

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(240)]


class Stream:
    """A streaming completion held open after its first token."""

    def __init__(self, host: str, port: int, prompt_chars: int, tokens: int = 3000) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        body = {"model": "dlb-emulated", "prompt": "x" * prompt_chars, "max_tokens": tokens, "stream": True}
        self.conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200
        self.server = self.resp.getheader("x-dlb-server")
        assert self.resp.readline().startswith(b"data: ")

    def close(self) -> None:
        self.conn.close()


@pytest.mark.parametrize(("policy", "third_rank"), [("jsq", "dp-dp0"), ("bf-io", "dp-dp1")])
def test_leaf_picks_the_rank_by_the_groups_policy(policy: str, third_rank: str) -> None:
    # A slow clock (time_scale 5) keeps the held streams open for the whole test.
    with dp_cell(policy, dp_size=2, max_batch=8, max_num_seqs=0, time_scale=5.0, background_probes=False) as cell:
        host, port = cell.leaf
        streams = []
        try:
            streams.append(Stream(host, port, prompt_chars=4 * 20_000))  # both ranks empty: rank 0
            streams.append(Stream(host, port, prompt_chars=8))  # fewest residents: rank 1
            assert [s.server for s in streams] == ["dp-dp0", "dp-dp1"]
            streams.append(Stream(host, port, prompt_chars=400))
            assert streams[2].server == third_rank
            # The leaf tracks both ranks' predicted KV, the heavy rank far above the light one. Polled: a rank's
            # report taken before it admitted the light requests (a slow step on a loaded box) shows 0 until
            # its next one, and decoded tokens now come from the streams, not from elapsed time.
            def rank_kv() -> list[float]:
                return [float(line.rpartition(" ")[2]) for line in cell.leaf_metrics().splitlines()
                        if line.startswith("dlb_leaf_dp_rank_kv_tokens{")]  # fmt: skip

            try:
                _until(lambda: (kv := rank_kv()) and len(kv) == 2 and kv[0] > 10 * kv[1] > 0, "both ranks' KV", timeout=10)
            except AssertionError:
                pass  # asserted below, with the values
            kv = rank_kv()
            assert len(kv) == 2 and kv[0] > 10 * kv[1] > 0, kv
        finally:
            for s in streams:
                s.close()


def test_overloaded_dp_cell_reports_barrier_idle_per_rank() -> None:
    with dp_cell("bf-io", dp_size=2, max_batch=4, mean_decode=16.0) as cell:
        before = rank_totals(cell.rank_ports)
        out = drive(*cell.leaf, workload(40, seed=3, prompt_median_tokens=800, mean_decode=16.0), rate=40.0,
                    seed=3, timeout_s=60.0)  # fmt: skip
        after = rank_totals(cell.rank_ports)
        # Every request answered, both ranks used, and the access log closed every resident on the leaf.
        assert out["statuses"] == {200: 40}
        assert set(out["served"]) == {"dp-dp0", "dp-dp1"}
        assert after["tokens"] > before["tokens"]
        assert after["idle"] > before["idle"] and after["busy"] > before["busy"]
        _until(lambda: "dlb_leaf_rif 0.0" in cell.leaf_metrics(), "leaf sees every request finish")


def _counted(cell) -> float:  # type: ignore[no-untyped-def]
    return sum(float(line.rpartition(" ")[2]) for line in cell.leaf_metrics().splitlines()
               if line.startswith("dlb_leaf_dp_stream_tokens_total "))  # fmt: skip


def _post(host: str, port: int, path: str, body: dict[str, object]) -> bytes:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


def test_leaf_counts_the_decoded_tokens_its_clients_receive() -> None:
    """The leaf's count of decoded tokens (from the response streams the leaf Envoy proxies) equals
    what the clients read: SSE completions and chat, with and without usage, and a JSON body; and the
    count arrives while a stream runs, not only at its end."""
    with dp_cell("bf-io", dp_size=2, max_batch=8, time_scale=5.0, background_probes=False) as cell:
        host, port = cell.leaf
        out = drive(host, port, workload(6, seed=4, prompt_median_tokens=200, mean_decode=20.0), rate=20.0,
                    seed=4, timeout_s=60.0, stream=True)  # fmt: skip
        assert out["statuses"] == {200: 6} and out["tokens_received"] > 6
        got = out["tokens_received"]
        chat = _post(host, port, "/v1/chat/completions", {"model": "dlb-emulated", "max_tokens": 9, "stream": True,
                                                          "messages": [{"role": "user", "content": "hi"}]})
        got += streamed_tokens(chat)
        plain = json.loads(_post(host, port, "/v1/completions", {"model": "dlb-emulated", "prompt": "x", "max_tokens": 5}))
        got += plain["usage"]["completion_tokens"]
        _until(lambda: "dlb_leaf_rif 0.0" in cell.leaf_metrics(), "leaf sees every request finish")
        assert _counted(cell) == got
        # Mid-stream: after the client has read 10 tokens of a long one, the leaf has counted them.
        s = Stream(host, port, prompt_chars=40, tokens=3000)
        try:
            for _ in range(9):
                assert s.resp.readline() == b"\n" and s.resp.readline().startswith(b"data: {")
            _until(lambda: _counted(cell) >= got + 10, "the leaf counts a running stream")
        finally:
            s.close()
