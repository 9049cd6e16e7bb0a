"""One ``GET /metrics`` of an inference server or a gateway, on asyncio streams, and the vLLM gauges in it.

Why in ``dlb.probe``: a leaf agent scrapes its own servers (queue gauges next to its own counts), and a
root scrapes a cell DLB does not run (:mod:`dlb.probe.foreign`) the same way; neither depends on the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families


async def http_get(address: str, path: str, timeout_s: float) -> bytes:
    """The body of a 200 answer to ``GET path`` from ``address`` (HTTP/1.1, one request per connection,
    on asyncio streams: Envoy's admin refuses HTTP/1.0); OSError for anything else, TimeoutError when
    it takes longer than ``timeout_s``."""
    host, _, port = address.rpartition(":")
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(timeout_s):
            raw = await reader.read(-1)
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


async def tcp_accepts(address: str, timeout_s: float) -> None:
    """Return once ``address`` accepts a TCP connection (closed at once); OSError or TimeoutError if it does not."""
    host, _, port = address.rpartition(":")
    async with asyncio.timeout(timeout_s):
        _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    writer.close()


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


#: The lines :func:`parse_vllm` reads; every other line of a (large) ``/metrics`` page is skipped unparsed.
_WANTED = ("vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count", "vllm:num_requests_running",
           "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "dlb_dp_max_num_seqs",
           "dlb_dp_kv_tokens", "vllm:cache_config_info{")


def _samples(text: str) -> Iterator[tuple[str, Mapping[str, str], float]]:
    """(name, labels, value) of each wanted line, parsed by prometheus_client: a timestamp after the value,
    escaped label values and NaN are the exposition format's, not guessed. A malformed line is skipped, not
    the scrape (a page of thousands of lines costs only its few wanted ones)."""
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                for sample in family.samples:
                    yield sample.name, sample.labels, float(sample.value)
        except ValueError:
            continue


def parse_vllm(text: str) -> Scrape:
    """A server's figures from its Prometheus text: the counts summed over label sets, the usage the
    largest (vLLM v0 ``gpu_cache_usage_perc`` or v1 ``kv_cache_usage_perc``), a DP rank's admission
    bound and resident KV tokens if it exports them (vLLM: usage × ``cache_config_info``'s blocks × block
    size), and its whole-request latency histogram's (sum, count) per series."""
    running = waiting = kv = limit = kv_tokens = cache = None
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for name, labels, value in _samples(text):
        if name.startswith("vllm:e2e_request_latency_seconds_"):
            series = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            (sums if name.endswith("_sum") else counts)[series] = value
        elif name == "vllm:num_requests_running":
            running = (running or 0.0) + value
        elif name == "vllm:num_requests_waiting":
            waiting = (waiting or 0.0) + value
        elif name in ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"):
            kv = max(kv or 0.0, value)
        elif name == "dlb_dp_max_num_seqs":
            limit = value
        elif name == "dlb_dp_kv_tokens":
            kv_tokens = value
        elif name == "vllm:cache_config_info":
            try:
                cache = float(labels["num_gpu_blocks"]) * float(labels["block_size"])
            except (KeyError, ValueError):
                pass
    if kv_tokens is None and cache is not None and kv is not None:
        kv_tokens = kv * cache
    latency = {k: (sums[k], counts[k]) for k in sums.keys() & counts.keys()} or None
    if running is None and waiting is None:
        return Scrape(0.0, 0.0, None, limit, kv_tokens, latency)  # reachable, but no vLLM gauges: "no extra load known"
    return Scrape(running, waiting, kv, limit, kv_tokens, latency)
