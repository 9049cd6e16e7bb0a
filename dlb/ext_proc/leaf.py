"""The leaf agent (``dlb serve leaf``): picks servers in its cell, measures it, answers probes.

One gRPC server (grpc.aio + uvloop) carries the probe and access-log services; the ExternalProcessor
runs on DLB's HTTP/2 transport on its own address (``cells[].leaf.ext_proc``), or on that gRPC
server when it shares the probe's address:

- ``dlb.v1.Probe`` — roots poll it; the answer is built from memory (no I/O).
- Envoy ``ExternalProcessor`` — the leaf Envoy asks which server gets a request; we answer
  ``x-dlb-server: ip:port`` (pre-serialised per server) for its ORIGINAL_DST cluster.
- Envoy ``AccessLogService`` — the leaf Envoy streams one entry per finished request (and, with
  ``flush_access_log_on_new_request``, one per started request). Completions release RIF and feed
  the latency fit and the error rate, off the request path and batched by Envoy.

Why the access log and not ext_proc response processing for completions: the ext_proc response
phase would add a second synchronous round trip per request and only sees response *headers* (for
streamed generations the end of the stream, hence the latency, is only known at stream end, which the
access log reports with the status and timings). See docs/data-plane.md for the measurement.

Background tasks (never on the request path): scrape each server's ``/metrics`` (vLLM gauges
``vllm:num_requests_running`` / ``vllm:num_requests_waiting``), refit the latency model in a worker
thread, expire lost in-flight records, and send background probe requests when the cell is idle
(:mod:`dlb.core.background`): a real inference request POSTed to this cell's own leaf Envoy, so it
takes the data path real traffic takes (leaf Envoy → this agent's server pick → a server → the
access log), tagged by its ``x-request-id`` so a refusal (4xx) is not taken for a latency sample.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import math
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
import numpy as np
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dlb.config import Config
from dlb.config.model import DpGroup
from dlb.config.tls import component_identity
from dlb.core.background import BackgroundProbeConfig, BackgroundProber, capacity_floor, surprise
from dlb.core.bfio import DpBalancer
from dlb.core.estimator import EstimatorConfig
from dlb.core.fit import MIN_PRIOR_SAMPLES
from dlb.core.latency_model import latency
from dlb.core.server_pick import PrequalConfig
from dlb.envoy import contract
from dlb.envoy.contract import SERVER_CHECK_INTERVAL_S, SERVER_CHECK_JITTER_S
from dlb.errors import BindError
from dlb.ext_proc.leaf_state import Completion, LeafState, ServerState
from dlb.ext_proc.protocol import CONTINUE, ExtProcServer, ext_proc_handler, header_response, header_value, load_cell
from dlb.log import get_logger
from dlb.probe.codec import model_message
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.service.health import HealthState, health_handler
from dlb.service.metrics import FastHistogram, Readiness, serve_metrics
from dlb.service.ports import add_port
from dlb.service.runner import run_event_loop, write_ready
from dlb.service.serve import serve_until_signal

log = get_logger("dlb.leaf")

REQUEST_ID = "x-request-id"
#: How long a recovered server waits before the probes count it (``LeafState.rejoin_hold_s``): the leaf
#: Envoy's health-check period and jitter, plus 0.2 s for the check's own round trip and this loop's lateness.
REJOIN_HOLD_S = SERVER_CHECK_INTERVAL_S + SERVER_CHECK_JITTER_S + 0.2
#: ``x-request-id`` prefix of the leaf's own background probe requests.
BACKGROUND_PROBE_ID = "dlb-background-probe-"
CONTENT_LENGTH = "content-length"
_START = accesslog_pb2.AccessLogType.Value("DownstreamStart")
_PERIODIC = (accesslog_pb2.AccessLogType.Value("DownstreamPeriodic"), accesslog_pb2.AccessLogType.Value("UpstreamPeriodic"),
             accesslog_pb2.AccessLogType.Value("UpstreamPoolReady"))


def _seconds(d) -> float:
    return d.seconds + d.nanos * 1e-9


def _serving_seconds(common) -> float:
    """The server's share of a request: first byte sent upstream → last byte back from upstream.

    Not the leaf-side total: that would include the leaf's own filters, notably the testbed's WAN
    delay (applied at the leaf Envoy, before the upstream), and the roots add the network delay to
    ℓ(N) themselves — counting it in the model too would count it twice.
    """
    if common.HasField("time_to_last_upstream_rx_byte") and common.HasField("time_to_first_upstream_tx_byte"):
        return _seconds(common.time_to_last_upstream_rx_byte) - _seconds(common.time_to_first_upstream_tx_byte)
    if common.HasField("time_to_last_downstream_tx_byte"):
        return _seconds(common.time_to_last_downstream_tx_byte)
    return _seconds(common.duration)


def _cut_stream(entry) -> bool:
    """True if the server started a response and then the upstream stream broke (issue 13, item 6).

    Envoy logs the status it had forwarded (e.g. 200) with details
    ``upstream_reset_after_response_started{reason}`` and a flag for the reason: a SIGKILLed HTTP/1.1
    server's unterminated chunked body is ``protocol_error`` (UPE, measured), a dead HTTP/2 connection
    UC or UR, Envoy's own reset LR, the route timeout mid-body UT. Without this a stream cut after its
    headers counted as a fast success: a 200 and a short latency sample. A reset before any response
    byte has status 0 or Envoy's own 503, an error already.
    """
    status = entry.response.response_code.value
    if not 0 < status < 400:
        return False
    if entry.response.response_code_details.startswith("upstream_reset_after_response_started"):
        return True
    f = entry.common_properties.response_flags
    return bool(f.upstream_remote_reset or f.upstream_connection_termination or f.local_reset
                or f.upstream_request_timeout or f.upstream_protocol_error)


def _address(addr) -> str:
    sa = addr.socket_address
    if not sa.address:
        return ""
    return f"[{sa.address}]:{sa.port_value}" if ":" in sa.address else f"{sa.address}:{sa.port_value}"


class LeafAgent:
    """The leaf's gRPC servicers around one :class:`LeafState`."""

    def __init__(self, state: LeafState, clock=time.monotonic) -> None:
        self.state = state
        self.clock = clock
        self.responses = [header_response([(contract.SERVER, s.address)], clear_route_cache=True) for s in state.servers]
        self.processing = FastHistogram()
        self.als_entries = 0
        #: Completions per source cell (the root's ``x-dlb-src-cell``), reported in probes: the demand a
        #: central controller (MNLB on the real data path) measures. Bounded by the config's cells: a
        #: header naming no known source (a client cannot set it: the root Envoy strips it) is not counted.
        self.completed_by_source: dict[str, int] = {}
        self.known_sources: frozenset[str] | None = None
        self.als_streams = 0
        self.probes = 0
        self.fits = 0
        self.fit_seconds = 0.0
        #: Whether this cell's leaf Envoy accepts connections (see :meth:`envoy_check_loop`).
        self.envoy_ok = True
        self.envoy_check_failures = 0
        #: Counters of the HTTP/2 ext_proc transport when it serves this agent (exported at scrape time).
        self.transport_stats = None
        #: Background probes (None until :meth:`background_loop` runs) and their outcomes.
        self.prober: BackgroundProber | None = None
        self.bg_ok = 0
        self.bg_failed = 0
        self.bg_seconds = 0.0
        self._bg_tasks: set[asyncio.Task] = set()
        #: Set when background probes declared the cell changed: the fit loop refits at once.
        self.refit_now = False

    # -- ext_proc (request path) -------------------------------------------------------------------
    def handle(self, message: bytes) -> tuple[bytes, bool]:
        """One serialised ``ProcessingRequest`` in, ``(reply, end_of_call)`` out (both transports).

        The call stays open after the pick (``end`` False): an Envoy configured to send response
        headers too gets them answered on the same stream, and Envoy closes it with the request.
        """
        t0 = time.perf_counter()
        req = ep.ProcessingRequest.FromString(message)
        which = req.WhichOneof("request")
        if which == "request_headers":
            rid = None
            length = None  # the body's size, for the tokens-waiting pick (the leaf never reads the body)
            for h in req.request_headers.headers.headers:
                if h.key == REQUEST_ID:
                    rid = header_value(h)
                elif h.key == CONTENT_LENGTH:
                    try:
                        length = int(header_value(h))
                    except ValueError:
                        length = None
            out = self.responses[self.state.pick(self.clock(), rid, length)]
        else:
            out = CONTINUE.get(which, CONTINUE["request_headers"])
        self.processing.observe(time.perf_counter() - t0)
        return out, False

    # -- access log (completions) -------------------------------------------------------------------
    async def StreamAccessLogs(self, requests: AsyncIterator[als_pb2.StreamAccessLogsMessage], context) -> als_pb2.StreamAccessLogsResponse:
        self.als_streams += 1
        stream_id = self.als_streams
        try:
            await self._consume_logs(requests, stream_id)
        except asyncio.CancelledError:
            # The server is stopping and Envoy's log stream never ends on its own: cancellation is how
            # it ends, not an error (re-raised, grpc.aio logged a CancelledError traceback at shutdown).
            pass
        finally:
            # Starts this stream reported can no longer complete through it (Envoy reconnects with a new
            # stream after a restart): forget them now rather than after max_age_s.
            dropped = self.state.drop_owner(stream_id, self.clock())
            if dropped:
                log.info("als_stream_ended", stream=stream_id, inflight_dropped=dropped)
        return als_pb2.StreamAccessLogsResponse()

    async def _consume_logs(self, requests: AsyncIterator[als_pb2.StreamAccessLogsMessage], stream_id: int = 0) -> None:
        async for msg in requests:
            if not msg.HasField("http_logs"):
                continue
            now = self.clock()
            st = self.state
            for e in msg.http_logs.log_entry:
                self.als_entries += 1
                common = e.common_properties
                kind = common.access_log_type
                rid = e.request.request_id
                if kind == _START:
                    st.start(now, rid, owner=stream_id)
                    continue
                if kind in _PERIODIC:
                    continue
                flags = common.response_flags
                src = e.request.request_headers.get(contract.SRC_CELL)
                if src and (self.known_sources is None or src in self.known_sources) and not rid.startswith(BACKGROUND_PROBE_ID):
                    self.completed_by_source[src] = self.completed_by_source.get(src, 0) + 1
                st.complete(now, Completion(
                    request_id=rid,
                    upstream=_address(common.upstream_remote_address),
                    status=e.response.response_code.value,
                    duration_s=_serving_seconds(common),
                    client_abort=bool(flags.downstream_connection_termination) and e.response.response_code.value == 0,
                    probe=rid.startswith(BACKGROUND_PROBE_ID),
                    cut=_cut_stream(e),
                ))

    # -- probes -------------------------------------------------------------------------------------
    async def Probe(self, request: probe_pb2.ProbeRequest, context) -> probe_pb2.ProbeResponse:
        self.probes += 1
        if not self.envoy_ok:
            # The control path is up but the data path is not: roots must not send here.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"leaf Envoy of cell {self.state.cell} is unreachable")
        return self.snapshot(self.clock())

    def snapshot(self, now: float) -> probe_pb2.ProbeResponse:
        st = self.state
        est = st.estimator
        return probe_pb2.ProbeResponse(
            cell=st.cell, rif=float(st.rif), replicas=st.replicas, healthy_replicas=st.healthy_replicas(now),
            model=model_message(est.params, est.confidence, len(est)),
            error_rate=st.errors.rate(now), timestamp_unix_ns=time.time_ns(), completed=st.completed,
            errors=st.failed, waiting=st.waiting(), completed_by_source=self.completed_by_source,
        )

    # -- background work ----------------------------------------------------------------------------
    async def fit_loop(self) -> None:
        """Refit the latency model every ``refit_period_s`` in a worker thread.

        The fit (scipy least squares) takes milliseconds; running it on the event loop would stall
        every request the leaf is picking for. We refit a shallow copy whose sample deques are copied
        on the loop thread (so the worker never iterates a deque that is being appended to), then
        publish the result.
        """
        est = self.state.estimator
        loop = asyncio.get_running_loop()
        last = self.clock()
        while True:
            await asyncio.sleep(min(0.05, est.config.refit_period_s))
            now = self.clock()
            # Refit on schedule, or at once when the first samples can replace the configured prior
            # (a fresh or restarted leaf: its warm-up probes just completed).
            first = est.config.measure_prior and est.effective_prior is est.prior and len(est) >= MIN_PRIOR_SAMPLES
            t_change = est.take_change()  # the traffic's own samples say the cell changed (dlb.core.change)
            if t_change is not None:
                self.refit_now = True
                log.info("cell_change_detected", cell=self.state.cell, source="traffic", since=round(t_change, 3))
            if now - last < est.config.refit_period_s and not first and not self.refit_now:
                continue
            last, self.refit_now = now, False
            try:
                self.state.expire(now)
                shadow = copy.copy(est)
                shadow._t, shadow._rif, shadow._lat = copy.copy(est._t), copy.copy(est._rif), copy.copy(est._lat)
                t0 = time.perf_counter()
                await loop.run_in_executor(None, shadow.refit, now)
                self.fit_seconds += time.perf_counter() - t0
                self.fits += 1
                est.params, est.confidence, est.last_result, est._last_fit = shadow.params, shadow.confidence, shadow.last_result, now
                est.effective_prior, est._stride = shadow.effective_prior, shadow._stride
            except Exception:
                log.exception("fit_failed", cell=self.state.cell)

    async def scrape_loop(self, period_s: float, timeout_s: float) -> None:
        """Poll every server's Prometheus ``/metrics`` for vLLM queue gauges."""
        while True:
            started = self.clock()
            results = await asyncio.gather(*(scrape_vllm(s.address, timeout_s) for s in self.state.servers),
                                           return_exceptions=True)
            for i, r in enumerate(results):
                if isinstance(r, ScrapeSlow):
                    self.state.on_scrape_slow(i)
                elif isinstance(r, BaseException):
                    raise r
                else:
                    self.state.on_scrape(i, *r, now=self.clock())
            await asyncio.sleep(max(0.0, period_s - (self.clock() - started)))

    async def background_loop(self, address: str, config: BackgroundProbeConfig, body: bytes, tick_s: float = 0.25) -> None:
        """Send one background probe request through this cell's leaf Envoy whenever the rule says so.

        The rule (:class:`BackgroundProber`) watches the cell's completions: a cell with traffic never
        probes; an idle one probes within its capacity budget, and a new leaf warms up at once. Each
        probe runs as its own task, so a slow server never delays the loop or the request path.
        """
        prober = self.prober = BackgroundProber(config)
        st = self.state
        seq = 0
        while True:
            await asyncio.sleep(tick_s)
            now = self.clock()
            p = st.estimator.params
            while self.envoy_ok and prober.due(now, st.completed, capacity_floor(st.healthy(now), p.a, p.b)):
                prober.on_sent(now)
                seq += 1
                task = asyncio.create_task(self._background_probe(address, body, f"{BACKGROUND_PROBE_ID}{os.getpid()}-{seq}",
                                                                  config.timeout_s))
                self._bg_tasks.add(task)
                task.add_done_callback(self._bg_tasks.discard)

    async def _background_probe(self, address: str, body: bytes, request_id: str, timeout_s: float) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        p = self.state.estimator.params
        predicted = float(latency(self.state.rif + 1, p.a, p.b, p.c, p.s))
        t0 = self.clock()
        status = 0
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: " + address.encode() +
                         b"\r\ncontent-type: application/json\r\nconnection: close\r\nx-request-id: " +
                         request_id.encode() + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            raw = await asyncio.wait_for(reader.read(-1), timeout_s)
            line = raw.split(b"\r\n", 1)[0].split()
            status = int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/1.") else 0
        except (TimeoutError, OSError, ValueError):
            status = 0
        finally:
            if writer is not None:
                writer.close()
        elapsed = self.clock() - t0
        surprised = 0
        if 200 <= status < 300:
            self.bg_ok += 1
            self.bg_seconds += elapsed
        else:
            self.bg_failed += 1
            if self.bg_failed == 1 or self.bg_failed % 100 == 0:
                log.warning("background_probe_failed", cell=self.state.cell, status=status, failed=self.bg_failed)
        pr = self.prober
        if pr is not None:
            if 200 <= status < 300:
                surprised = surprise(elapsed, predicted, pr.config.tolerance)
            pr.on_done(self.clock(), surprised)
            t_change = pr.take_change()
            if t_change is not None:
                # The cell is no longer what its samples say (it recovered, or slowed while idle).
                dropped = self.state.estimator.forget_before(t_change)
                self.refit_now = True
                log.info("cell_change_detected", cell=self.state.cell, direction="slower" if surprised > 0 else "faster",
                         samples_dropped=dropped)

    async def envoy_check_loop(self, address: str, period_s: float, fail_threshold: int = 2) -> None:
        """TCP-connect to the leaf Envoy's listener every ``period_s``.

        Probes reach the agent directly, not through the leaf Envoy; without this check a dead leaf
        Envoy would leave the cell looking healthy to every root while all its requests fail.
        """
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        while True:
            ok = True
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), min(1.0, 5 * period_s))
                writer.close()
            except (TimeoutError, OSError):
                ok = False
            if ok:
                if not self.envoy_ok:
                    log.info("leaf_envoy_reachable", cell=self.state.cell, address=address)
                self.envoy_check_failures = 0
                self.envoy_ok = True
            else:
                self.envoy_check_failures += 1
                if self.envoy_ok and self.envoy_check_failures >= fail_threshold:
                    log.warning("leaf_envoy_unreachable", cell=self.state.cell, address=address)
                    self.envoy_ok = False
            await asyncio.sleep(period_s)

    # -- metrics -----------------------------------------------------------------------------------
    def collect(self) -> Iterable:
        st = self.state
        now = self.clock()
        c = st.cell
        yield GaugeMetricFamily("dlb_leaf_rif", "Requests in flight counted by the leaf", value=st.rif)
        srif = GaugeMetricFamily("dlb_leaf_server_rif", "Leaf-counted RIF per server", labels=["server"])
        sscr = GaugeMetricFamily("dlb_leaf_server_scraped_load", "running + waiting scraped from the server (-1 unknown)", labels=["server"])
        stok = GaugeMetricFamily("dlb_leaf_server_tokens", "Leaf-counted tokens waiting per server (size estimates of requests in flight)", labels=["server"])
        picks = CounterMetricFamily("dlb_leaf_server_picks", "Requests sent to each server", labels=["server"])
        serr = CounterMetricFamily("dlb_leaf_server_errors", "Failed completions per server", labels=["server"])
        cut = CounterMetricFamily("dlb_leaf_cut_streams", "Responses a server started and then broke off (reset mid-body)", labels=["server"])
        for s in st.servers:
            srif.add_metric([s.address], s.rif)
            sscr.add_metric([s.address], s.scraped)
            stok.add_metric([s.address], s.tokens)
            picks.add_metric([s.address], s.picks)
            serr.add_metric([s.address], s.errors)
            cut.add_metric([s.address], s.cut_streams)
        yield from (srif, sscr, stok, picks, serr, cut)
        if st.dp_groups:
            kv = GaugeMetricFamily("dlb_leaf_dp_rank_kv_tokens", "Predicted resident KV tokens per DP rank", labels=["server"])
            for bal, members in st.dp_groups:
                for addr, v in zip(members, bal.kv(now), strict=True):
                    kv.add_metric([addr], float(v))
            yield kv
        yield GaugeMetricFamily("dlb_leaf_healthy_servers", "Servers usable for picking", value=st.healthy(now))
        yield GaugeMetricFamily("dlb_leaf_envoy_reachable", "1 if the leaf Envoy accepts connections", value=float(self.envoy_ok))
        yield GaugeMetricFamily("dlb_leaf_error_rate", "EMA error fraction reported in probes", value=st.errors.rate(now))
        yield CounterMetricFamily("dlb_leaf_completed", "Completions seen in the access log", value=st.completed)
        yield CounterMetricFamily("dlb_leaf_failed", "Completions counted as errors", value=st.failed)
        yield CounterMetricFamily("dlb_leaf_inflight_expired", "In-flight records dropped after max age", value=st.expired)
        yield CounterMetricFamily("dlb_leaf_inflight_refused", "Request starts not recorded: the in-flight table was full",
                                  value=st.inflight_refused)
        yield CounterMetricFamily("dlb_leaf_inflight_orphaned", "In-flight records dropped when the access-log stream that opened them ended",
                                  value=st.orphaned)
        yield CounterMetricFamily("dlb_leaf_probes", "Probe requests answered", value=self.probes)
        yield CounterMetricFamily("dlb_leaf_als_entries", "Access-log entries received", value=self.als_entries)
        model = GaugeMetricFamily("dlb_leaf_model", "Published latency-model parameter", labels=["param"])
        p = st.estimator.params
        for name, v in (("a_s", p.a), ("b_s", p.b), ("c", p.c), ("s", p.s), ("confidence", st.estimator.confidence),
                        ("samples", float(len(st.estimator)))):
            model.add_metric([name], v)
        yield model
        yield CounterMetricFamily("dlb_leaf_fit_seconds", "Time spent fitting the latency model", value=self.fit_seconds)
        bg = CounterMetricFamily("dlb_leaf_background_probes", "Background probe requests sent by this leaf", labels=["outcome"])
        bg.add_metric(["ok"], self.bg_ok)
        bg.add_metric(["failed"], self.bg_failed)
        yield bg
        yield CounterMetricFamily("dlb_leaf_background_probe_seconds", "Summed latency of successful background probes",
                                  value=self.bg_seconds)
        yield self.processing.family("dlb_leaf_processing_seconds", "Time to pick a server inside the service")
        if self.transport_stats is not None:
            yield from self.transport_stats.families("dlb_leaf")
        del c


class ScrapeSlow(Exception):
    """The server accepted the scrape but did not answer within the timeout: busy, not dead."""


async def scrape_vllm(address: str, timeout_s: float) -> tuple[float | None, float | None, float | None]:
    """(running, waiting, KV-cache usage) from ``http://address/metrics``: the counts summed over label
    sets, the usage the largest (vLLM v0 ``gpu_cache_usage_perc`` or v1 ``kv_cache_usage_perc``);
    all None when the server is unreachable (refused, reset, not HTTP 200). Raises :class:`ScrapeSlow`
    when it connected but answered too late: a loaded server (or a loaded box) is slow to render
    ``/metrics``, and reading that as "down" took whole healthy cells offline (two slow scrapes per
    server made the leaf report 0 healthy replicas, and the roots drop such a cell).

    A tiny HTTP/1.0 GET on asyncio streams: no client library on the leaf, and nothing blocks.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
        writer.write(f"GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        body = await asyncio.wait_for(reader.read(-1), timeout_s)
    except TimeoutError:
        raise ScrapeSlow(address) from None
    except (OSError, ValueError):
        return None, None, None
    finally:
        if writer is not None:
            writer.close()
    head, _, text = body.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None, None, None
    running = waiting = kv = None
    for line in text.decode("utf-8", "replace").splitlines():
        if line.startswith("vllm:num_requests_running"):
            running = (running or 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:num_requests_waiting"):
            waiting = (waiting or 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")):
            kv = max(kv or 0.0, float(line.rsplit(" ", 1)[1]))
    if running is None and waiting is None:
        return 0.0, 0.0, None  # reachable, but no vLLM gauges: treat as "no extra load known"
    return running, waiting, kv


def _ip_address(host: str, port: int) -> str:
    """``ip:port`` of a server address that is an IP: Envoy's ORIGINAL_DST cluster and the access log speak IPs."""
    import ipaddress

    ip = ipaddress.ip_address(host)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def resolve_all_sync(host: str, port: int) -> list[str]:
    """Every IP of ``host`` (A and AAAA); raises OSError naming it when it has none."""
    import socket

    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
def dp_balancer(dp: DpGroup) -> DpBalancer:
    """The rank picker of one data-parallel server, from its config (file or xDS DpGroups)."""
    return DpBalancer(ranks=dp.ranks, policy=dp.policy, horizon=dp.horizon, mean_decode_tokens=dp.mean_decode_tokens,
                      slots=dp.max_num_seqs)


def rank_addresses(host: str, port: int, ranks: int) -> list[str]:
    """The leaf's keys of a DP server's ranks (rank r on port + r), as its server list spells them."""
    return [_ip_address(host, port + r) for r in range(ranks)]


def state_from_config(cfg: Config, cell_name: str, choices: int = 2, seed: int | None = None,
                      refit_period_s: float = 5.0, window_s: float = 60.0, pick_rule: str = "prequal",
                      resolve: Callable[[str, int], list[str]] = resolve_all_sync) -> LeafState:
    """The leaf's starting state. A server named by DNS stands for every address the name has now
    (a headless Service: one per pod), as the control plane's discovery publishes them; with ``--xds``
    the agent then follows those updates over EDS."""
    from dlb.config.discovery import dns_names, expand

    names = {h: p for h, p in dns_names(cfg).items() if any(s.address.host == h for s in cfg.cell(cell_name).servers)}
    cfg = expand(cfg, {h: resolve(h, p) for h, p in names.items()})
    cell = cfg.cell(cell_name)
    # The cell serves every endpoint with the same servers: one cell-wide model, prior of the first endpoint.
    prior = cfg.endpoints[0].latency_prior.to_core()
    servers: list[ServerState] = []
    dp_groups: list[tuple[DpBalancer, list[str]]] = []
    for s in cell.servers:
        ranks = [ServerState(_ip_address(a.host, a.port), float(s.weight)) for a in s.rank_addresses()]
        servers += ranks
        if s.dp is not None:
            dp_groups.append((dp_balancer(s.dp), [r.address for r in ranks]))
    return LeafState(cell=cell.name, servers=servers, replicas=cell.replicas, prior=prior, choices=choices, dp_groups=dp_groups,
                     estimator_config=EstimatorConfig(window_s=window_s, refit_period_s=refit_period_s),
                     rng=np.random.default_rng(seed), pick_rule=pick_rule, rejoin_hold_s=REJOIN_HOLD_S,
                     prequal=PrequalConfig(probes_per_pick=choices, pool_size=max(16, choices)))


def _bind_als(server: grpc.aio.Server, address: str) -> None:
    """Bind the access-log server; a socket file left by a killed agent is replaced (a live one is not)."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # nobody listens there: stale
            else:
                raise BindError(address, "another process serves this access-log socket")
            finally:
                probe.close()
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise BindError(address, "gRPC could not bind it (in use, or no such directory?)")


async def run_leaf(cfg: Config, cell_name: str, listen: list[str], metrics: str | None, ready_file: str | None,
                   choices: int, scrape_period_s: float, seed: int | None, refit_period_s: float,
                   envoy_check_period_s: float = 0.2, xds: str | None = None, xds_delta: bool = False,
                   ext_proc_h2: str | None = None, drain_s: float = 0.0, background: BackgroundProbeConfig | None = None,
                   background_body: bytes = b"", pick_rule: str = "prequal",
                   window_s: float = 60.0, envoy_address: str | None = None) -> None:
    """Serve probes, the access log and (on ``listen``) ext_proc on grpc.aio; with ``ext_proc_h2``
    the ext_proc is served on that address by DLB's HTTP/2 transport instead (the request path).

    ``envoy_address`` is this agent's own leaf Envoy, which it checks and sends background probes
    through (default ``cells[].leaf.address``). In a pod that is ``127.0.0.1:<port>``: the cell's
    address is then a load balancer in front of the pod, which could answer while this Envoy is dead.
    """
    state = state_from_config(cfg, cell_name, choices, seed, refit_period_s, window_s, pick_rule=pick_rule)
    agent = LeafAgent(state)
    agent.known_sources = frozenset(cfg.cell_names)
    sync = None
    if xds:
        from dlb.ext_proc.leaf_xds import LeafXdsSync

        sync = LeafXdsSync(state, xds, cell_name, delta=xds_delta, tls=component_identity(cfg.tls, "leaf", cell_name, cfg.source))
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 10000)])
    health = HealthState()
    server.add_generic_rpc_handlers((ext_proc_handler(agent.handle), health_handler(health)))
    probe_pb2_grpc.add_ProbeServicer_to_server(agent, server)
    # The access log gets a server of its own on a channel only the cell's Envoy reaches (docs/security.md);
    # it answers grpc.health.v1 too (Envoy health-checks its agent cluster there).
    als_server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 64)])
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(agent, als_server)
    als_server.add_generic_rpc_handlers((health_handler(health),))
    als_address = cfg.cell(cell_name).leaf.access_log_address()
    _bind_als(als_server, als_address)
    tls = component_identity(cfg.tls, "leaf", cell_name, cfg.source)
    ports = [add_port(server, addr, tls) for addr in listen]
    h2 = None
    if ext_proc_h2 is not None:
        h2 = ExtProcServer("h2", agent.handle, health=health, tls=tls)  # NOT_SERVING with the rest of the leaf on drain
        ports.append(await h2.bind(ext_proc_h2))
        agent.transport_stats = h2.stats
    metrics_port = None
    readiness = Readiness()  # /readyz: 200 once the gRPC server serves, 503 again from the drain's start
    if metrics:
        host, _, mport = metrics.rpartition(":")
        _, metrics_port = serve_metrics(agent.collect, host.strip("[]") or "127.0.0.1", int(mport), lambda: readiness.ready and health.serving)
    await server.start()
    await als_server.start()
    readiness.ready = True
    if sync is not None:
        await sync.start()
    tasks = [asyncio.create_task(agent.fit_loop())]
    envoy_address = envoy_address or str(cfg.cell(cell_name).leaf.address)
    if envoy_check_period_s > 0:
        agent.envoy_ok = False  # not ready for traffic until the first check finds the leaf Envoy up
        tasks.append(asyncio.create_task(agent.envoy_check_loop(envoy_address, envoy_check_period_s)))
    if scrape_period_s > 0:
        tasks.append(asyncio.create_task(agent.scrape_loop(scrape_period_s, min(1.0, max(0.2, scrape_period_s)))))
    if background is not None:
        tasks.append(asyncio.create_task(agent.background_loop(envoy_address, background, background_body)))
    log.info("leaf_started", cell=cell_name, grpc_ports=ports, metrics_port=metrics_port, access_log=als_address,
             servers=[s.address for s in state.servers], choices=choices)
    if ready_file:
        write_ready(ready_file, {"grpc": ports[0], "grpc_ports": ports, "metrics": metrics_port, "pid": os.getpid()})

    async def on_stop() -> None:
        readiness.ready = False
        for t in tasks:
            t.cancel()
        if sync is not None:
            await sync.stop()
        if h2 is not None:
            await h2.stop()
        await als_server.stop(0.5)
        if als_address.startswith("unix:"):
            with contextlib.suppress(OSError):
                os.unlink(als_address[len("unix:"):])
        log.info("leaf_stopping", cell=cell_name)

    await serve_until_signal(server, on_stop, health=health, drain_s=drain_s)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.drain_s < math.inf:  # as dlb serve root: nan would skip the drain, inf never end it
        raise SystemExit(f"--drain-s must be >= 0 and finite, got {args.drain_s}")
    cfg, cell = load_cell(args.config, args.cell)
    if args.envoy_check_address is not None:
        from dlb.config.loader import parse_hostport

        if parse_hostport(args.envoy_check_address) is None:
            raise SystemExit(f"dlb serve leaf: --envoy-check-address: {args.envoy_check_address!r} is not host:port")
    # Probe and access log on one gRPC server. The ext_proc is served there too when it shares the
    # probe's address (or --ext-proc-transport grpc); on its own address it gets the HTTP/2 transport.
    listen = [args.listen or str(cell.leaf.probe)]
    ext_proc_h2 = None
    if args.listen is None and cell.leaf.ext_proc is not None and cell.leaf.ext_proc != cell.leaf.probe:
        if args.ext_proc_transport == "h2":
            ext_proc_h2 = str(cell.leaf.ext_proc)
        else:
            listen.append(str(cell.leaf.ext_proc))
    metrics = args.metrics
    if metrics is None:
        metrics = f"{cell.leaf.probe.host}:{cell.leaf.probe.port + 10000}"
    run_event_loop(run_leaf(cfg, args.cell, listen, metrics or None, args.ready_file, args.choices,
                            args.scrape_period_ms / 1000.0, args.seed, args.refit_period_s, args.envoy_check_period_ms / 1000.0,
                            xds=args.xds, xds_delta=args.xds_delta, ext_proc_h2=ext_proc_h2, drain_s=args.drain_s,
                            background=_background_config(args), background_body=background_body(args), pick_rule=args.pick,
                            window_s=args.window_s, envoy_address=args.envoy_check_address))
    return 0


def _background_config(args: argparse.Namespace) -> BackgroundProbeConfig | None:
    if args.background_probe_min_interval_ms <= 0:
        return None
    try:
        return BackgroundProbeConfig(min_interval_s=args.background_probe_min_interval_ms / 1000.0,
                                     max_interval_s=args.background_probe_max_interval_ms / 1000.0,
                                     budget=args.background_probe_budget)
    except ValueError as e:
        raise SystemExit(f"dlb serve leaf: --background-probe-*: {e}") from None


def background_body(args: argparse.Namespace) -> bytes:
    """The probe: a chat completion of exactly ``--background-probe-max-tokens`` tokens (``ignore_eos``,
    so its size — and so its latency — does not vary from probe to probe)."""
    import json

    body: dict = {"messages": [{"role": "user", "content": "dlb background probe"}],
                  "max_tokens": args.background_probe_max_tokens, "ignore_eos": True}
    if args.background_probe_model:
        body["model"] = args.background_probe_model
    return json.dumps(body, separators=(",", ":")).encode()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("leaf", help="leaf agent: picks servers in a cell, measures it, answers probes")
    p.add_argument("--config", required=True, help="DLB config YAML")
    p.add_argument("--xds", default=None, help="control plane host:port: follow its server set (EDS) and fleet prior")
    p.add_argument("--xds-delta", action="store_true", help="use incremental xDS with the control plane")
    p.add_argument("--cell", required=True, help="the cell this leaf serves")
    p.add_argument("--listen", default=None, help="gRPC host:port for probe + ext_proc + access log (default: cells[].leaf.probe)")
    p.add_argument("--metrics", default=None, help="Prometheus host:port ('' = off; default: probe host, probe port + 10000)")
    p.add_argument("--pick", choices=("prequal", "rif"), default="prequal",
                   help="server pick: balance tokens waiting (Prequal probe pool + hot-cold rule; default) or RIF (power-of-d)")
    p.add_argument("--choices", type=int, default=2,
                   help="servers probed per pick (power-of-d's d; >= servers = least loaded)")
    p.add_argument("--scrape-period-ms", type=float, default=200.0, help="server /metrics scrape period (0 = off)")
    p.add_argument("--envoy-check-period-ms", type=float, default=200.0,
                   help="TCP check of this agent's leaf Envoy (--envoy-check-address); probes fail while it is down (0 = off)")
    p.add_argument("--envoy-check-address", default=None,
                   help="this agent's own leaf Envoy host:port, checked and used for background probes (default: "
                        "cells[].leaf.address; in a pod 127.0.0.1:<port>, not the cell's load balancer)")
    p.add_argument("--refit-period-s", type=float, default=5.0, help="latency-model refit period")
    p.add_argument("--background-probe-min-interval-ms", type=float, default=1000.0,
                   help="background probe requests when the cell is idle: at most one per this (0 = off)")
    p.add_argument("--background-probe-max-interval-ms", type=float, default=15000.0,
                   help="... and at least one per this while idle (how soon a change on an idle cell is seen)")
    p.add_argument("--background-probe-budget", type=float, default=0.008,
                   help="largest share of the cell's request capacity (1/b of its model) idle probing may use")
    p.add_argument("--background-probe-max-tokens", type=int, default=16,
                   help="tokens each probe generates: set it near the endpoint's mean output length")
    p.add_argument("--background-probe-model", default=None, help="'model' field of the probe request (default: none)")
    p.add_argument("--window-s", type=float, default=60.0,
                   help="latency-model sample window (s); shorter forgets a past slowdown sooner (dlb demo: 10)")
    p.add_argument("--ready-file", default=None, help="write {grpc, metrics, pid} JSON here once serving")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ext-proc-transport", choices=("h2", "grpc"), default="h2",
                   help="server for cells[].leaf.ext_proc when it has its own address: DLB's HTTP/2 transport (default) or grpc.aio")
    p.add_argument("--drain-s", type=float, default=1.0,
                   help="on SIGTERM: seconds of gRPC health NOT_SERVING (Envoy stops sending) before streams are closed")
    p.set_defaults(func=run)
