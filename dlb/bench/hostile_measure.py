"""What ``dlb bench hostile`` measures while an attack runs: memory, loop responsiveness, real traffic.

Kept apart from the harness (:mod:`dlb.bench.hostile`) because it is the part a reader must trust:
RSS is read from ``/proc/PID/status``; a service's event-loop block is the round trip of a tiny RPC it
answers on that loop (a ping), sent from a thread of its own so a blocked service never stops the RSS
samples; real traffic is recorded per request (start, milliseconds, ok).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dlb.bench.hostile_attacks import EXT_PROC_PATH


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


@dataclass
class Monitor:
    """Samples one process's RSS every ``period_s`` and, on a thread of its own (a blocked service must
    not stop the RSS samples), the round trip of ``ping()`` — the service loop's responsiveness."""

    period_s: float = 0.02
    rss: list[tuple[float, float]] = field(default_factory=list)  # (t, MB)
    pings: list[tuple[float, float]] = field(default_factory=list)  # (start, round trip ms)
    _pid: int | None = None
    _ping: Callable[[], None] | None = None
    _ping_started: float | None = None  # a ping in flight (its wait so far counts too)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def watch(self, pid: int | None, ping: Callable[[], None] | None) -> None:
        self._pid, self._ping = pid, ping

    def start(self) -> None:
        for fn in (self._sample_rss, self._sample_ping):
            t = threading.Thread(target=fn, name=f"hostile{fn.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _sample_rss(self) -> None:
        while not self._stop.wait(self.period_s):
            pid = self._pid
            mb = rss_mb(pid) if pid else None
            if mb is not None:
                self.rss.append((time.monotonic(), mb))

    def _sample_ping(self) -> None:
        while not self._stop.is_set():
            ping = self._ping
            if ping is None:
                self._stop.wait(self.period_s)
                continue
            t = self._ping_started = time.monotonic()
            try:
                ping()
            except Exception:  # refused or timed out: the wait is what a blocked (or dead) loop costs
                pass
            self._ping_started = None
            rtt = (time.monotonic() - t) * 1000.0
            self.pings.append((t, rtt))
            self._stop.wait(max(0.0, self.period_s - rtt / 1000.0))

    def rss_window(self, t0: float, t1: float) -> list[float]:
        return [mb for t, mb in self.rss if t0 <= t <= t1]

    def worst_ping_ms(self, t0: float, t1: float) -> float | None:
        """The longest round trip of the pings that overlapped [t0, t1] (one still waiting counts so far)."""
        out = [ms for t, ms in self.pings if t <= t1 and t + ms / 1000.0 >= t0]
        started = self._ping_started
        if started is not None and started <= t1:
            out.append((time.monotonic() - started) * 1000.0)
        return max(out) if out else None


@dataclass
class Traffic:
    """Real requests through the root Envoy at ``rate`` per second, each recorded as (start, ms, ok)."""

    send: Callable[[], bool]
    rate: float = 10.0
    records: list[tuple[float, float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hostile-traffic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _one(self) -> None:
        t = time.monotonic()
        try:
            ok = self.send()
        except Exception:
            ok = False
        self.records.append((t, (time.monotonic() - t) * 1000.0, ok))

    def _run(self) -> None:
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="hostile-req") as pool:
            nxt = time.monotonic()
            while not self._stop.is_set():
                pool.submit(self._one)
                nxt += 1.0 / self.rate
                self._stop.wait(max(0.0, nxt - time.monotonic()))

    def window(self, t0: float, t1: float) -> list[tuple[float, float, bool]]:
        return [r for r in self.records if t0 <= r[0] <= t1]


def p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


# --- the services' own tiny RPCs (pings) -----------------------------------------------------------


def secure_or_plain(target: str, creds: Any) -> Any:
    """A sync gRPC channel: mTLS with ``creds`` (the bench's own identity), else plaintext."""
    import grpc

    return grpc.insecure_channel(target) if creds is None else grpc.secure_channel(target, creds)


def ext_proc_ping(target: str, creds: Any = None, channel: Any = None) -> Callable[[], None]:
    """One ext_proc exchange (request headers in, a reply out) on ``channel`` (default: one kept open)."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    channel = channel if channel is not None else secure_or_plain(target, creds)
    call = channel.stream_stream(EXT_PROC_PATH, request_serializer=ep.ProcessingRequest.SerializeToString,
                                 response_deserializer=ep.ProcessingResponse.FromString)
    msg = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"), base_pb2.HeaderValue(key=":method", raw_value=b"POST")])))

    def ping() -> None:
        for _ in call(iter([msg]), timeout=5):
            return

    return ping


def new_channel_call_ms(target: str, creds: Any = None) -> float | None:
    """Milliseconds from opening a new gRPC channel (a new connection, as a restarted Envoy makes) to the
    reply of one ext_proc exchange on it; None if it failed within 5 s."""
    t = time.monotonic()
    try:
        with secure_or_plain(target, creds) as channel:
            ext_proc_ping(target, channel=channel)()
    except Exception:
        return None
    return (time.monotonic() - t) * 1000.0


def probe_ping(target: str, creds: Any = None) -> Callable[[], None]:
    from dlb.proto import probe_pb2, probe_pb2_grpc

    stub = probe_pb2_grpc.ProbeStub(secure_or_plain(target, creds))
    return lambda: stub.Probe(probe_pb2.ProbeRequest(source_cell="hostile-bench"), timeout=5) and None


def health_ping(target: str, creds: Any = None) -> Callable[[], None]:
    call = secure_or_plain(target, creds).unary_unary("/grpc.health.v1.Health/Check")
    return lambda: call(b"", timeout=5) and None


def gc_pauses(metrics_text: str, prefix: str) -> dict[str, float]:
    """A service's garbage-collection pauses from its /metrics (``dlb/gc_heap.py``): total and longest
    seconds per generation, in ms — to tell a collection from other loop blocks."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name in (f"{prefix}_gc_pause_seconds", f"{prefix}_gc_pause_longest_seconds"):
            kind = "total" if fam.name.endswith("_pause_seconds") else "longest"
            for sample in fam.samples:
                if sample.name.endswith("_created"):
                    continue
                out[f"gc{sample.labels['generation']}_{kind}_ms"] = round(sample.value * 1000.0, 1)
    return out


# --- the service's own loop lag (dlb/service/loop_lag.py) -------------------------------------------


@dataclass(frozen=True)
class LagReading:
    """One read of a service's ``<prefix>_loop_lag_*`` families: cumulative beats per bucket bound, and
    the longest lag of the last 60 s (a beat still overdue included)."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound in s, cumulative beats); the last bound is inf
    longest_s: float


def loop_lag(metrics_text: str, prefix: str) -> LagReading | None:
    """The service's loop-lag families from its /metrics (None if it exports none)."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: list[tuple[float, float]] = []
    longest = None
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == f"{prefix}_loop_lag_seconds":
            buckets = sorted((float(s.labels["le"]), s.value) for s in fam.samples if s.name.endswith("_bucket"))
        elif fam.name == f"{prefix}_loop_lag_longest_seconds":
            longest = fam.samples[0].value
    return LagReading(tuple(buckets), longest) if buckets and longest is not None else None


def window_lag(before: LagReading, after: LagReading, window_s: float, over_s: float) -> dict[str, Any]:
    """The worst heartbeat lag in the ``window_s`` between two reads, and the beats over ``over_s`` (a bucket bound).

    Exact when the 60-s longest gauge rose between the reads and the window fits in its 60 s: the
    gauge's later value is then a lag of the window (anything older it covers, the earlier read
    covered too). Otherwise an upper bound (``exact`` false): the highest bucket that gained a beat,
    narrowed by the later gauge when the window fits in it (both bound the window's lags from above).
    The count over ``over_s`` is exact either way. A beat still overdue at the second read is not in
    the histogram yet; ``longest_60s_ms`` (the later gauge) shows it.
    """
    prev = dict(before.buckets)
    gained = [(bound, count - prev.get(bound, 0.0)) for bound, count in after.buckets]
    beats = gained[-1][1]
    if over_s not in dict(gained):
        raise ValueError(f"{over_s} s is not a bucket bound of the loop-lag histogram")
    out: dict[str, Any] = {"max_ms": None, "exact": False, "beats": int(beats), "over": int(beats - dict(gained)[over_s]),
                           "longest_60s_ms": round(after.longest_s * 1000.0, 1)}
    if beats <= 0:
        return out
    fits = window_s < 59.0  # the gauge's 60 one-second slots cover the whole window
    upper = next(bound for bound, count in gained if count >= beats)  # cumulative: every new beat is at or under it
    if fits and after.longest_s > before.longest_s:
        upper, out["exact"] = after.longest_s, True
    elif upper == float("inf"):  # over the last bound (5 s): the gauge's figure, at least that bound
        upper = max(gained[-2][0], after.longest_s)
    elif fits:
        upper = min(upper, after.longest_s)
    out["max_ms"] = round(upper * 1000.0, 1)
    return out
