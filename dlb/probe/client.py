"""The root's probe client: polls every leaf's ``dlb.v1.Probe`` and caches the answers.

A cell DLB does not run (``cells[].leaf.source`` ``vllm`` or ``gie``) is polled the same way, through
its metrics (:mod:`dlb.probe.foreign`), at most every :data:`~dlb.probe.foreign.MIN_PERIOD_S`.

One asyncio task per destination cell, so a slow or dead leaf delays nobody else. Requests never
wait for a probe: the router reads whatever the cache holds, and :class:`RootRouter` itself treats
state older than ``stale_after`` as unusable. On failure the task backs off exponentially (period ×
2^failures, capped at ``backoff_max``) so a dead leaf costs little, and after ``fail_threshold``
consecutive failures it marks the cell unavailable at once instead of waiting for staleness.

A restarted leaf must be back in the roots' view within 1 s of its agent being ready. Two back-offs
stand between them: this loop's (``backoff_max_s``, 0.5 s by default) and the gRPC channel's own
reconnect back-off, which would otherwise grow to its 5-s cap while the leaf is down and hold every
probe at "UNAVAILABLE" without trying to connect. The channel's is capped at
:data:`RECONNECT_BACKOFF_MAX_MS`, so the worst case is about 0.5 s + 0.25 s (+ 20 % jitter).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from dlb.core.latency_model import LatencyParams
from dlb.core.leaf_replicas import ReplicaMerge
from dlb.log import get_logger
from dlb.probe.codec import cell_response, check_answer, replica_answer
from dlb.probe.foreign import MIN_PERIOD_S, ForeignProber
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2, probe_pb2_grpc

log = get_logger("dlb.probe_client")


#: Cap of the gRPC channel's reconnect back-off (see the module docstring); a reconnect attempt to a
#: dead leaf is one refused TCP connect.
RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 250


@dataclass(frozen=True)
class ProbeTiming:
    period_s: float = 0.02
    timeout_s: float = 0.2
    backoff_max_s: float = 0.5
    fail_threshold: int = 2


@dataclass
class ProbeStats:
    """Per-cell probe bookkeeping (exported as metrics)."""

    ok: int = 0
    errors: int = 0
    consecutive_failures: int = 0
    last_ok: float = -math.inf  # monotonic time of the last good answer
    last_error: str = ""
    last_rtt_s: float = math.nan
    last: probe_pb2.ProbeResponse | None = None
    available: bool = False


@dataclass
class ProbeClient:
    """Probes a set of leaves forever; calls ``on_result(target, response|None, now)`` per probe."""

    targets: list[ProbeTarget]
    on_result: Callable[[ProbeTarget, probe_pb2.ProbeResponse | None, float], None]
    timing: ProbeTiming = field(default_factory=ProbeTiming)
    source_cell: str = ""
    clock: Callable[[], float] = time.monotonic
    credentials: grpc.ChannelCredentials | None = None  # mTLS to the leaves' probe servers (None: plaintext)
    #: Makes each leaf's "renewed since?" question (dlb.config.tls.Renewal): a renewed certificate gets a new channel.
    renewal: Callable[[], Callable[[], grpc.ChannelCredentials | None]] | None = None
    #: A foreign cell's latency prior by name, what its fitted model shrinks toward (None: no model for it).
    prior_of: Callable[[str], LatencyParams] | None = None
    #: Per (cell index, leaf replica).
    stats: dict[tuple[int, int], ProbeStats] = field(default_factory=dict)
    #: The cells with more than one leaf replica: their replicas' answers merged (dlb.core.leaf_replicas).
    merges: dict[int, ReplicaMerge] = field(default_factory=dict)
    #: Each cell's last answer as ``on_result`` got it (a multi-replica cell's merged one).
    cell_last: dict[int, probe_pb2.ProbeResponse] = field(default_factory=dict)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _channels: list[grpc.aio.Channel] = field(default_factory=list)
    _leaf_channels: list[_LeafChannel] = field(default_factory=list)

    def start(self) -> None:
        replicas = collections.Counter(t.index for t in self.targets)
        self.merges = {j: ReplicaMerge() for j, n in replicas.items() if n > 1}
        for t in self.targets:
            self.stats[t.key] = ProbeStats()
            if t.source != "dlb":  # a cell DLB does not run: its metrics are scraped over HTTP
                prober = ForeignProber(t, self.prior_of(t.name) if self.prior_of is not None else None, self.clock)
                self._tasks.append(asyncio.create_task(self._loop(t, prober, max(self.timing.period_s, MIN_PERIOD_S)), name=f"probe-{t.name}"))
                continue
            options: list[tuple[str, int | str]] = [
                ("grpc.enable_retries", 0), ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
                ("grpc.max_reconnect_backoff_ms", min(RECONNECT_BACKOFF_MAX_MS, int(self.timing.backoff_max_s * 1000)))]
            if t.tls_name:
                options.append(("grpc.ssl_target_name_override", t.tls_name))
            request = probe_pb2.ProbeRequest(source_cell=self.source_cell)
            if self.credentials is None:
                channel = grpc.aio.insecure_channel(t.address, options=options)
                ask: Callable[[float], Awaitable[probe_pb2.ProbeResponse]] = functools.partial(
                    _ask_leaf, probe_pb2_grpc.ProbeStub(channel), request)
                self._channels.append(channel)
            else:
                leaf = _LeafChannel(t.address, options, grpc.aio.secure_channel(t.address, self.credentials, options=options),
                                    self.renewal() if self.renewal is not None else None)
                ask = functools.partial(leaf.ask, request)
                self._leaf_channels.append(leaf)
            self._tasks.append(asyncio.create_task(self._loop(t, ask, self.timing.period_s), name=f"probe-{t.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for ch in self._channels + [leaf.channel for leaf in self._leaf_channels]:
            await ch.close()
        self._tasks.clear()
        self._channels.clear()
        self._leaf_channels.clear()

    async def _loop(self, target: ProbeTarget, ask: Callable[[float], Awaitable[probe_pb2.ProbeResponse]], period_s: float) -> None:
        st = self.stats[target.key]
        timing = self.timing
        while True:
            started = self.clock()
            try:
                if target.emulated_one_way_s > 0:
                    await asyncio.sleep(target.emulated_one_way_s)  # the request's trip to the leaf
                resp = await ask(timing.timeout_s)
                if target.emulated_one_way_s > 0:
                    await asyncio.sleep(target.emulated_one_way_s)  # the answer's trip back
                check_answer(target, resp)
            except (grpc.aio.AioRpcError, ValueError) as exc:
                now = self.clock()
                st.errors += 1
                st.consecutive_failures += 1
                reason = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                if reason != st.last_error or st.consecutive_failures == timing.fail_threshold:
                    log.warning("probe_failed", cell=target.name, address=target.address, reason=reason,
                                consecutive=st.consecutive_failures)
                st.last_error = reason
                # A leaf that never answered is reported dead too (once): a restarted root routes by
                # static weights to cells it has no news of, never to cells known to fail.
                never_answered = st.ok == 0 and st.consecutive_failures == timing.fail_threshold
                if st.consecutive_failures >= timing.fail_threshold and (st.available or never_answered):
                    st.available = False
                    self._deliver(target, None, now)
                delay = min(timing.backoff_max_s, period_s * (2.0 ** st.consecutive_failures))
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad answer kill the probe loop
                log.exception("probe_loop_error", cell=target.name)
                delay = timing.backoff_max_s
            else:
                now = self.clock()
                if st.consecutive_failures:
                    log.info("probe_recovered", cell=target.name, after_failures=st.consecutive_failures)
                st.ok += 1
                st.consecutive_failures = 0
                st.last_error = ""
                st.last_ok = now
                st.last_rtt_s = now - started
                st.last = resp
                st.available = True
                self._deliver(target, resp, now)
                delay = period_s - (now - started)
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)

    def _deliver(self, target: ProbeTarget, resp: probe_pb2.ProbeResponse | None, now: float) -> None:
        """Hand one probe result on: as it is for a one-replica cell; for a cell with leaf replicas, the
        merged answer of its live replicas (None only when none is live), under its replica-0 target."""
        merge = self.merges.get(target.index)
        if merge is not None:
            cell = merge.update(target.replica, None if resp is None else replica_answer(resp), now)
            target = next(t for t in self.targets if t.index == target.index and t.replica == 0)
            if cell is None:
                resp = None
            else:
                parts = [st.last for (j, _), st in self.stats.items() if j == target.index and st.available and st.last is not None]
                resp = cell_response(cell, parts or [probe_pb2.ProbeResponse(cell=target.name)])
        if resp is not None:
            self.cell_last[target.index] = resp
        self.on_result(target, resp, now)

    def cell_stats(self, index: int) -> ProbeStats | None:
        """One cell's probe bookkeeping over its replicas: counts summed, the freshest answer's age and RTT."""
        parts = [st for (j, _), st in self.stats.items() if j == index]
        if not parts:
            return None
        fresh = max(parts, key=lambda st: st.last_ok)
        return ProbeStats(ok=sum(st.ok for st in parts), errors=sum(st.errors for st in parts),
                          consecutive_failures=min(st.consecutive_failures for st in parts), last_ok=fresh.last_ok,
                          last_error=fresh.last_error, last_rtt_s=fresh.last_rtt_s, last=self.cell_last.get(index),
                          available=any(st.available for st in parts))


@dataclass
class _LeafChannel:
    """A leaf's mTLS channel, made anew when our certificate was renewed (a channel keeps the pair it
    was made with for every reconnect). Probes to one leaf are sequential: none is in flight on the old one."""

    address: str
    options: list[tuple[str, int | str]]
    channel: grpc.aio.Channel
    renewed: Callable[[], grpc.ChannelCredentials | None] | None

    async def ask(self, request: probe_pb2.ProbeRequest, timeout_s: float) -> probe_pb2.ProbeResponse:
        fresh = self.renewed() if self.renewed is not None else None
        if fresh is not None:
            old, self.channel = self.channel, grpc.aio.secure_channel(self.address, fresh, options=self.options)
            await old.close()
        return await _ask_leaf(probe_pb2_grpc.ProbeStub(self.channel), request, timeout_s)


async def _ask_leaf(stub: probe_pb2_grpc.ProbeStub, request: probe_pb2.ProbeRequest, timeout_s: float) -> probe_pb2.ProbeResponse:
    """One ``dlb.v1.Probe`` call to a DLB leaf agent."""
    return await stub.Probe(request, timeout=timeout_s)
