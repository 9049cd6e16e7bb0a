"""One ``GET /metrics`` of an inference server or a gateway, on asyncio streams, and the vLLM gauges in it.

Why in ``dlb.probe``: a leaf agent scrapes its own servers (queue gauges next to its own counts), and a
root scrapes a cell DLB does not run (:mod:`dlb.probe.foreign`) the same way; neither depends on the other.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import NamedTuple


async def http_get(address: str, path: str, timeout_s: float) -> bytes:
    """The body of a 200 answer to ``GET path`` from ``address`` (HTTP/1.1, one request per connection,
    on asyncio streams: Envoy's admin refuses HTTP/1.0); OSError for anything else, TimeoutError when
    it takes longer than ``timeout_s``."""
    host, _, port = address.rpartition(":")
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(-1), timeout_s)
    finally:
        if writer is not None:
            writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *headers = head.split(b"\r\n")
    if not status.startswith(b"HTTP/1.") or b" 200 " not in status + b" ":
        raise OSError(f"GET {path} from {address}: {status.decode(errors='replace')!r}")
    if any(h.lower().startswith(b"transfer-encoding:") and b"chunked" in h.lower() for h in headers):
        body = _unchunk(body)
    return body


def _unchunk(data: bytes) -> bytes:
    """A chunked body's payload (ValueError if the framing is broken)."""
    out = bytearray()
    while True:
        line, sep, data = data.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if not sep or len(data) < size:
            raise ValueError("truncated chunked body")
        if size == 0:
            return bytes(out)
        out += data[:size]
        data = data[size + 2:]


class Scrape(NamedTuple):
    """What one ``/metrics`` scrape of a server says (None: not exported, or the scrape failed)."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    admit_limit: float | None = None  # a DP rank's running-slot bound (dlb_dp_max_num_seqs)
    kv_tokens: float | None = None  # resident KV tokens (dlb_dp_kv_tokens, or vLLM usage × cache size)
    #: ``vllm:e2e_request_latency_seconds``: series labels → (sum, count) since the server started.
    latency: Mapping[str, tuple[float, float]] | None = None


FAILED = Scrape(None, None, None)
_CACHE_LABEL = re.compile(r'(num_gpu_blocks|block_size)="(\d+)"')
#: A line of vLLM's whole-request latency histogram's sum or count: (which, labels, value).
_E2E = re.compile(r"vllm:e2e_request_latency_seconds_(sum|count)(\{[^}]*\})?\s+(\S+)")


class ScrapeSlow(Exception):
    """The server accepted the scrape but did not answer within the timeout: busy, not dead."""


async def scrape_vllm(address: str, timeout_s: float) -> Scrape:
    """A :class:`Scrape` of ``http://address/metrics`` (:func:`parse_vllm`); all None when the server is
    unreachable (refused, reset, not HTTP 200). Raises :class:`ScrapeSlow` when it connected but answered
    too late: a loaded server (or a loaded box) is slow to render ``/metrics``, and reading that as "down"
    took whole healthy cells offline (two slow scrapes per server made the leaf report 0 healthy replicas,
    and the roots drop such a cell).

    A tiny HTTP/1.0 GET on asyncio streams (:func:`http_get`): no client library on the leaf, and nothing blocks.
    """
    try:
        text = await http_get(address, "/metrics", timeout_s)
    except TimeoutError:
        raise ScrapeSlow(address) from None
    except (OSError, ValueError):
        return FAILED
    return parse_vllm(text.decode("utf-8", "replace"))


def parse_vllm(text: str) -> Scrape:
    """A server's figures from its Prometheus text: the counts summed over label sets, the usage the
    largest (vLLM v0 ``gpu_cache_usage_perc`` or v1 ``kv_cache_usage_perc``), a DP rank's admission
    bound and resident KV tokens if it exports them (vLLM: usage × ``cache_config_info``'s blocks × block
    size), and its whole-request latency histogram's (sum, count) per series."""
    running = waiting = kv = limit = kv_tokens = cache = None
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:e2e_request_latency_seconds_"):
            if m := _E2E.match(line):
                (sums if m[1] == "sum" else counts)[m[2] or ""] = float(m[3])
        elif line.startswith("vllm:num_requests_running"):
            running = (running or 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:num_requests_waiting"):
            waiting = (waiting or 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")):
            kv = max(kv or 0.0, float(line.rsplit(" ", 1)[1]))
        elif line.startswith("dlb_dp_max_num_seqs"):
            limit = float(line.rsplit(" ", 1)[1])
        elif line.startswith("dlb_dp_kv_tokens"):
            kv_tokens = float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:cache_config_info{"):
            fields = dict(_CACHE_LABEL.findall(line))
            if len(fields) == 2:
                cache = float(fields["num_gpu_blocks"]) * float(fields["block_size"])
    if kv_tokens is None and cache is not None and kv is not None:
        kv_tokens = kv * cache
    latency = {k: (sums[k], counts[k]) for k in sums.keys() & counts.keys()} or None
    if running is None and waiting is None:
        return Scrape(0.0, 0.0, None, limit, kv_tokens, latency)  # reachable, but no vLLM gauges: "no extra load known"
    return Scrape(running, waiting, kv, limit, kv_tokens, latency)
