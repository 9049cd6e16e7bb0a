"""``dlb bench faults``: what each failure of a part costs the clients, measured through real Envoys.

For every (fault, leaf mode) pair a fresh data plane is started on 127.0.0.1 (:mod:`dlb.testbed.stack`:
emulated servers, leaf agents + leaf Envoys, root service + root Envoy; by default cells ``a``/``b``/``c``
with 3/2/2 servers, ``a`` the root's own cell and the one that fails, ``b`` 20 ms and ``c`` 40 ms away;
for the control-plane fault also a control plane, which the leaf agents and the root follow over xDS).
Poisson traffic at ``rate`` req/s (default 40) goes to the root Envoy for the whole run — a mix of chat
completions, short streamed chats and ~3.5-s streams (:data:`MIX`) — the fault is injected at
``fault_at_s`` and undone ``outage_s`` later (20 s for the frozen leaf agent, :data:`OUTAGE_S`).
Every request is recorded (send time, end time, status, the server that answered, from the
emulator's ``x-dlb-server`` header), and each run is summarised as::

    {fault, mode, rate_rps, sent, ok, failed, inflight_at_fault, cut_streams, failed_new,
     new_fail_window_s, detect_s, recover_s, pre_share, loadavg_1m, verdict}

- ``inflight_at_fault``: sent before the fault, finished after it (any cell);
- ``cut_streams``: requests whose connection closed before a complete response, or streams that
  ended without ``data: [DONE]`` (status 0); ``refused``: requests that could not connect at all
  (status -1: the root Envoy was down);
- ``failed_new`` / ``new_fail_window_s``: failed requests *sent after* the fault, and how long after
  the fault the last of them was sent — the "at most 1 s of new requests" target;
- ``detect_s``: from the fault to the last failed request sent during the outage (0 if none failed):
  how long clients could still be hurt;
- ``loadavg_1m``: the box's 1-minute load average as the traffic starts and as it ends (a starved box
  delays DLB's own services, which some failures depend on);
- ``recover_s``: from the restore until a 1-s window of requests first gives cell ``a`` at least
  80 % of its pre-fault share (``pre_share``); ``null`` if that never happens in the run.

Verdict rules, written before the first run: root service, control plane, leaf agent (kill or
SIGSTOP): ``failed == 0``; one server or a whole cell: ``new_fail_window_s <= 1`` (failures only
among requests in flight at the fault plus at most 1 s of new ones); leaf Envoy: no failure but
streams whose answer had started (the root retries the rest on a fallback cell); cell overload
(cell ``a``'s servers :data:`OVERLOAD_SLOWDOWN` times slower, ``/health`` answered after 1.5 s):
``failed <= 1 %`` of sent and the leaf Envoy never counts fewer healthy servers than it has
(``envoy_min_healthy``; ``cell_load`` is the mean share of the cell's batch slots busy meanwhile);
every fault: ``recover_s`` not null and ``<= 10``. The root Envoy fault has no failure target (a killed
root Envoy is the client's own connection); with two root Envoys sharing the address
(``root_envoy_replica``, one killed) no request written after the killed Envoy exited may fail
(``failed_after_exit``; ``exit_after_fault_s`` says how long the SIGKILL took to reap it; a request
written before went into the dying process's socket, in flight on it; ``failed_new`` still counts from
the signal). ``control_plane_replica``
kills the first of two control-plane replicas, the one the services follow: ``failed == 0``.
``leaf_replica_kill`` gives every cell two leaf replicas and kills one of cell ``a``'s (its Envoy and its
agent): no failure but streams whose answer had started on it, as for the leaf Envoy. ``leaf_replica_freeze``
SIGSTOPs that replica instead (it still accepts connections): ``failed == 0`` (what it held waits for it,
``stalled``) and no request sent more than :data:`FREEZE_DETECT_S` after the freeze waits for it
(``stall_window_s``: the root's detection). ``policy`` is the endpoint's DLB policy (``--policy``) or an
operator baseline (``lr-global``, ``locality-failover``, ``hub-score``: flow endpoints with that ``weights``
plugin, run as ``dlb up`` runs it — no root service, the root Envoy configured by the control plane; a row
that kills the root service is skipped, saying so); ``--native`` runs flow policies the same way (Envoy samples
the control plane's weights, each cell's weight retried once on its fallback cell);
with ``--runs N`` each row is run N times (seeds ``seed`` … ``seed + N - 1``) and reported as
min/median/max of its counts, passing only if every run passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dlb.bench import harness
from dlb.errors import UsageError

#: Faults an operator baseline has no part for, and why its rows are skipped (stated in the output).
BASELINE_SKIP = {"root_service": "no root service runs under an operator baseline or --native (Envoy alone routes)"}
#: Faults and whether they are run in each leaf mode ("ext_proc": the leaf agent picks servers;
#: "least_request": Envoy picks, the agent only measures).
FAULTS = ("server", "cell", "leaf_agent_kill", "leaf_agent_freeze", "leaf_envoy", "root_service", "control_plane",
          "control_plane_replica", "root_envoy", "root_envoy_replica", "cell_overload", "leaf_replica_kill", "leaf_replica_freeze")
MODES = ("ext_proc", "least_request")
NO_FAILURE_TARGET = {"root_service", "control_plane", "control_plane_replica", "leaf_agent_kill", "leaf_agent_freeze", "leaf_replica_freeze"}
#: The faults that give every cell two leaf replicas (one of cell ``a``'s fails).
REPLICA_FAULTS = ("leaf_replica_kill", "leaf_replica_freeze")
#: A frozen leaf replica must be out of the root's rotation within this long (its health check's budget).
FREEZE_DETECT_S = 4.0
#: Outages longer than ``--outage-s`` where the issue asks for one: a leaf agent frozen for 20 s.
OUTAGE_S = {"leaf_agent_freeze": 20.0}
WINDOW_TARGET = {"server", "cell"}


#: Status of a request whose connection was refused (never sent).
REFUSED = -1
#: The reason of a status-0 failure lost before any answer on a kept-alive connection (:func:`traced_open_loop`).
KEPT_ALIVE = "on a kept-alive connection"


@dataclass
class Sample:
    sent: float
    done: float
    status: int  # 0: connection closed before a full response, or a stream without [DONE]; REFUSED: could not connect
    server: str  # x-dlb-server of a 200; the error code of a JSON error reply; for status 0 why (KEPT_ALIVE); else ""
    kind: str = "chat"  # which request of the mix (:func:`request_mix`)
    peer: str = ""  # the address the request's connection went to (of several a name resolves to); "" if none
    written: float = math.nan  # when its bytes were handed to the socket (after ``sent``: a connect, a busy loop)


class _TraceConn(asyncio.Protocol):
    """HTTP/1.1 client connection: status, ``x-dlb-server``, content-length and chunked framing.

    A streamed (chunked) answer counts as complete only if it ended with its terminal chunk *and*
    carried ``data: [DONE]``: a server that dies mid-stream either leaves the chunked body unterminated
    (Envoy resets the client) or — an emulator stopping — ends it early without ``[DONE]``. Both are
    cut streams (status 0, ``server`` says which); a connection lost before any header is status 0, "".
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pending: list[asyncio.Future[tuple[int, str]]] = []
        self.closed = False
        self._head: tuple[int, str, int] | None = None  # (status, server, content-length or -1 = chunked)
        self._tail = b""  # last bytes of a chunked body (for data: [DONE])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _finish(self, status: int, server: str) -> None:
        self._head, self._tail = None, b""
        if self.pending:
            fut = self.pending.pop(0)
            if not fut.done():
                fut.set_result((status, server))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self._head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end]).lower()
                length, server = 0, ""
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k == b"content-length":
                        length = int(v)
                    elif k == b"transfer-encoding" and b"chunked" in v:
                        length = -1
                    elif k == b"x-dlb-server":
                        server = v.strip().decode()
                self._head = (int(head[9:12]), server, length)
                del self.buf[:end + 4]
            status, server, length = self._head
            if length >= 0:
                if len(self.buf) < length:
                    return
                if status != 200:  # keep the error's code (DLB's and Envoy's replies are JSON errors)
                    body = bytes(self.buf[:length])
                    at = body.find(b'"code":')
                    server = body[at + 7:].split(b",")[0].strip(b' "}').decode(errors="replace")[:80] if at >= 0 else ""
                del self.buf[:length]
                self._finish(status, server)
                continue
            if not self._chunks():
                return
            done = b"data: [DONE]" in self._tail
            self._finish(status if done or status != 200 else 0, server if done or status != 200 else "no [DONE]")

    def _chunks(self) -> bool:
        """Consume whole chunks from ``buf``; True once the terminal chunk (and its CRLF) is in."""
        while True:
            eol = self.buf.find(b"\r\n")
            if eol < 0:
                return False
            size = int(bytes(self.buf[:eol]).split(b";")[0], 16)
            if len(self.buf) < eol + 2 + size + 2:
                return False
            self._tail = (self._tail + bytes(self.buf[eol + 2:eol + 2 + size]))[-64:]
            del self.buf[:eol + 2 + size + 2]
            if size == 0:
                return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        cut = "" if self._head is None else f"cut after {self._head[0]}"  # only the first had its headers
        for k, fut in enumerate(self.pending):
            if not fut.done():
                fut.set_result((0, "" if k else cut))
        self.pending.clear()

    def send(self, data: bytes) -> asyncio.Future[tuple[int, str]]:
        fut: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self.pending.append(fut)
        assert self.transport is not None
        self.transport.write(data)
        return fut


async def _connect(host: str, port: int, rng: random.Random | None) -> _TraceConn:
    """A connection to ``host``; with ``rng``, to one of its addresses at random, the others tried in turn if
    it refuses (a Service's virtual IP spreads connections so; ``getaddrinfo`` alone sorts them, RFC 6724)."""
    loop = asyncio.get_running_loop()
    if rng is None:
        return (await loop.create_connection(_TraceConn, host, port))[1]
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    ips = sorted({str(i[4][0]) for i in infos})
    rng.shuffle(ips)
    for k, ip in enumerate(ips):
        try:
            return (await loop.create_connection(_TraceConn, ip, port))[1]
        except OSError:
            if k == len(ips) - 1:
                raise
    raise OSError(f"{host} has no address")


async def traced_open_loop(host: str, port: int, requests: Sequence[tuple[float, str, bytes]], rate: float,
                           duration_s: float, seed: int, events: list[tuple[float, Callable[[], Any]]],
                           origin: float, spread: bool = False, done_at: list[float] | None = None) -> list[Sample]:
    """Poisson arrivals for ``duration_s``, each a request of the mix ``(weight, kind, bytes)`` drawn at
    random; ``events`` (time after ``origin``, blocking action) run in a thread, and when each action
    returned (after ``origin``) is appended to ``done_at``; ``spread``: new connections go to a random
    address of ``host`` (:func:`_connect`)."""
    rng = random.Random(seed)
    weights = [w for w, _, _ in requests]
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    idle: list[_TraceConn] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(scheduled: float, kind: str, request: bytes) -> None:
        conn, peer, written = None, "", math.nan
        while idle:
            c = idle.pop()
            if not c.closed:
                conn = c
                break
        reused = conn is not None
        try:
            if conn is None:
                try:
                    conn = await _connect(host, port, rng if spread else None)
                except OSError:  # nobody listening (the root Envoy is down): refused, not cut
                    samples.append(Sample(scheduled - origin, time.monotonic() - origin, REFUSED, "", kind))
                    return
            peer = str((conn.transport.get_extra_info("peername") or ("",))[0]) if conn.transport is not None else ""
            written = time.monotonic() - origin
            async with asyncio.timeout(60):
                status, server = await conn.send(request)
        except (TimeoutError, OSError):
            status, server = 0, ""
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            conn = None
        if status == 0 and not server and reused:
            # Lost before any answer on a connection kept from an earlier request: the peer may have died
            # before this one was written (a client that retries such a request, as the OpenAI SDK does,
            # would not see it fail); told apart from a new connection's loss.
            server = KEPT_ALIVE
        samples.append(Sample(scheduled - origin, time.monotonic() - origin, status, server, kind, peer, written))
        if conn is not None and not conn.closed:
            idle.append(conn)

    async def run_events() -> None:
        for at, action in sorted(events, key=lambda e: e[0]):
            delay = origin + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await asyncio.to_thread(action)
            if done_at is not None:
                done_at.append(time.monotonic() - origin)

    ev = asyncio.create_task(run_events())
    t = origin
    stop = origin + duration_s
    while t < stop:
        delay = t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        _, kind, request = rng.choices(requests, weights)[0]
        task = loop.create_task(one(t, kind, request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        t += rng.expovariate(rate)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    await ev
    for c in idle:
        if c.transport is not None:
            c.transport.close()
    return samples


# -- faults ----------------------------------------------------------------------------------------


def _fault_actions(plane: Any, fault: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(inject, restore) for ``fault`` on cell ``a`` of ``plane``."""
    emus = plane.emulators["a"]
    ports: dict[int, int] = {}

    def stop_emus(which: list[int]) -> Callable[[], None]:
        def inject() -> None:
            for i in which:
                ports[i] = emus[i].port
                emus[i].stop()
        return inject

    def start_emus(which: list[int]) -> Callable[[], None]:
        def restore() -> None:
            for i in which:
                emus[i]._config = replace(emus[i]._config, port=ports[i])
                emus[i].start()
        return restore

    if fault == "server":
        return stop_emus([0]), start_emus([0])
    if fault == "cell":
        every = list(range(len(emus)))
        return stop_emus(every), start_emus(every)
    if fault == "leaf_agent_kill":
        return (lambda: plane.leaves["a"].proc.kill()), (lambda: plane.restart_leaf("a") and None)
    if fault == "leaf_agent_freeze":
        return (lambda: os.kill(plane.leaves["a"].pid, signal.SIGSTOP)), (lambda: os.kill(plane.leaves["a"].pid, signal.SIGCONT))
    if fault == "leaf_envoy":
        return (lambda: plane.leaf_envoys["a"].proc.kill()), (lambda: plane.leaf_envoys["a"].start() and None)
    if fault == "root_service":
        return (lambda: plane.root.proc.kill()), (lambda: plane.restart_root() and None)
    if fault in ("control_plane", "control_plane_replica"):  # the replica the services follow (the first of two)
        return (lambda: plane.control_plane.proc.kill()), (lambda: plane.restart_control_plane() and None)
    if fault == "cell_overload":
        def slow() -> None:
            for e in emus:
                e.set_faults(slowdown=OVERLOAD_SLOWDOWN, health_delay_ms=OVERLOAD_HEALTH_DELAY_MS)

        def fast() -> None:
            for e in emus:
                e.set_faults(slowdown=1.0, health_delay_ms=0.0)
        return slow, fast
    if fault == "root_envoy":
        return (lambda: plane.root_envoy.proc.kill()), (lambda: plane.root_envoy.start() and None)
    if fault == "leaf_replica_kill":  # one of cell a's two leaf replicas, its Envoy and its agent at once
        def kill_replica() -> None:
            plane.more_leaf_envoys["a"][0].proc.kill()
            plane.more_leaves["a"][0].proc.kill()

        def restart_replica() -> None:
            plane.more_leaves["a"][0] = plane._restart(plane.more_leaves["a"][0])
            plane.more_leaf_envoys["a"][0].start()
        return kill_replica, restart_replica
    if fault == "leaf_replica_freeze":  # SIGSTOP: it still accepts connections, answers nothing
        def signal_replica(sig: signal.Signals) -> Callable[[], None]:
            def send() -> None:
                for p in (plane.more_leaf_envoys["a"][0], plane.more_leaves["a"][0]):
                    os.kill(p.pid, sig)
            return send
        return signal_replica(signal.SIGSTOP), signal_replica(signal.SIGCONT)
    if fault == "root_envoy_replica":  # one of the two root Envoys sharing the root address
        def kill_replica() -> None:
            proc = plane.more_root_envoys[0].proc
            proc.kill()
            proc.wait(10)  # reaped: its sockets are closed, so what is written after this meets no Envoy of it
        return kill_replica, (lambda: plane.more_root_envoys[0].start() and None)
    raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")


# -- one run ---------------------------------------------------------------------------------------


def summarise(samples: list[Sample], fault: str, mode: str, rate: float, fault_at: float, restore_at: float,
              warmup_s: float = 1.0, window_s: float = 1.0, exited_at: float | None = None) -> dict[str, Any]:
    """One run's row (module docstring). ``exited_at``: when a killed part was reaped (its sockets closed),
    for the rows whose target is about requests that reached it only after it was gone."""
    ok = [s for s in samples if s.status == 200]
    failed = [s for s in samples if s.status != 200]
    pre = [s for s in ok if warmup_s <= s.sent < fault_at]
    pre_share = sum(1 for s in pre if s.server.startswith("a-")) / len(pre) if pre else math.nan
    new_failed = [s for s in failed if s.sent >= fault_at]
    outage_failed = [s for s in new_failed if s.sent < restore_at]
    recover = None
    end = max((s.sent for s in samples), default=restore_at)
    t = restore_at
    while t + window_s <= end:
        win = [s for s in samples if t <= s.sent < t + window_s]
        if win and math.isfinite(pre_share):
            share = sum(1 for s in win if s.status == 200 and s.server.startswith("a-")) / len(win)
            if share >= 0.8 * pre_share:
                recover = round(t - restore_at, 2)
                break
        t += 0.25
    row: dict[str, Any] = {
        "fault": fault, "mode": mode, "rate_rps": rate, "sent": len(samples), "ok": len(ok), "failed": len(failed),
        "inflight_at_fault": sum(1 for s in samples if s.sent < fault_at <= s.done),
        "cut_streams": sum(1 for s in samples if s.status == 0),
        "refused": sum(1 for s in samples if s.status == REFUSED),
        "failed_new": len(new_failed),
        "new_fail_window_s": round(max(s.sent for s in new_failed) - fault_at, 3) if new_failed else 0.0,
        "detect_s": round(max(s.sent for s in outage_failed) - fault_at, 3) if outage_failed else 0.0,
        "recover_s": recover,
        "pre_share": round(pre_share, 3) if math.isfinite(pre_share) else None,
        "statuses": {str(k): v for k, v in sorted(_count(s.status for s in samples).items())},
        "failure_codes": dict(sorted(_count(f"{s.status} {s.server}".strip() for s in failed).items())),
        "failure_codes_new": dict(sorted(_count(f"{s.status} {s.server}".strip() for s in new_failed).items())),
    }
    if exited_at is not None:
        # A request written before the kill took effect went into the dying process's own socket: in
        # flight on it. Its write time, not its schedule: a busy loop or a connect can write it later.
        row["exit_after_fault_s"] = round(exited_at - fault_at, 4)
        written = [s.sent if math.isnan(s.written) else s.written for s in failed]
        row["failed_after_exit"] = sum(1 for w in written if w >= exited_at)
        row["failed_written_after_fault_s"] = sorted(round(w - fault_at, 4) for w in written if w >= fault_at)
    row["verdict"] = verdict(row)
    return row


def stalls(samples: list[Sample], fault_at: float, restore_at: float) -> dict[str, Any]:
    """For a freeze: ``stalled``, requests sent during it that waited for it to end (sent early enough
    that even a long stream would have ended before the restore, and ended after it); ``stall_window_s``,
    how long after the fault the last of them was sent — until then the root still sent new requests to
    the frozen part, i.e. its detection time (0 if none waited)."""
    early = [s for s in samples if fault_at <= s.sent < restore_at - LONG_STREAM_S - 1.0 and s.done > restore_at]
    return {"stalled": len(early), "stall_window_s": round(max(s.sent for s in early) - fault_at, 3) if early else 0.0}


def _count(values: Any) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


#: The verdict rule of every row, as the results file states it.
VERDICT_RULE = ("0 failed requests (root service, control plane or one replica, leaf agent faults, a frozen leaf replica, whose "
               f"new requests stop going to it within {FREEZE_DETECT_S:g} s), 0 but streams "
                "already answering (leaf Envoy, one of two leaf replicas), 0 written after the killed one exited (one of two root Envoys), "
                "new requests failing for "
                "<= 1 s (cell and server faults), >= 99 % served and every server "
                "kept by its leaf Envoy (cell overload), recovered within 10 s")
#: Failures of a request whose answer had started (status 200, then cut): no proxy can retry those.
ANSWERING = ("0 cut after 200", "0 no [DONE]")


def verdict(row: dict[str, Any]) -> str:
    """The rule of the module docstring: "pass", or "fail: <which target>"."""
    why = []
    if row["fault"] in NO_FAILURE_TARGET and row["failed"] > 0:
        why.append(f"{row['failed']} failed (target 0)")
    if row["fault"] in ("leaf_envoy", "leaf_replica_kill") and (lost := sum(n for c, n in row["failure_codes"].items() if c not in ANSWERING)):
        why.append(f"{lost} failed before their answer started (target 0)")
    if row["fault"] == "cell_overload":
        if row["failed"] > 0.01 * row["sent"]:
            why.append(f"{row['failed']} of {row['sent']} failed (target <= 1 %)")
        if row.get("envoy_min_healthy") is not None and row["envoy_min_healthy"] < row.get("servers_a", row["envoy_min_healthy"]):
            why.append(f"the leaf Envoy kept only {row['envoy_min_healthy']} servers")
    if row.get("stall_window_s") is not None and row["stall_window_s"] > FREEZE_DETECT_S:
        why.append(f"new requests waited on the frozen replica for {row['stall_window_s']} s after the freeze (target <= {FREEZE_DETECT_S:g})")
    after_kill = row.get("failed_after_exit", row["failed_new"])
    if row["fault"] == "root_envoy_replica" and after_kill > 0:
        why.append(f"{after_kill} requests written after the killed Envoy exited failed (target 0: only those in flight on it)")
    if row["fault"] in WINDOW_TARGET and row["new_fail_window_s"] > 1.0:
        why.append(f"new requests failed for {row['new_fail_window_s']} s (target <= 1)")
    if row["recover_s"] is None or row["recover_s"] > 10.0:
        why.append(f"recover_s {row['recover_s']} (target <= 10)")
    return "pass" if not why else "fail: " + "; ".join(why)


#: Cells of the data plane: ``a`` (the root's cell, the one that fails), ``b`` 20 ms away, ``c`` 40 ms.
CELLS = (3, 2, 2)
ONE_WAY_MS = (0.0, 20.0, 40.0)
#: The request mix (weight, kind): chat completions, short streamed chats, long streams and legacy
#: ``/v1/completions``, plain and streamed (clients of both APIs must lose nothing).
MIX = ((0.4, "chat"), (0.2, "stream"), (0.1, "long"), (0.15, "completion"), (0.15, "completion_stream"))
#: The cell-overload row: cell ``a``'s servers this much slower, answering ``/health`` this late (a loaded
#: inference server's API), for the outage.
OVERLOAD_SLOWDOWN = 8.0
OVERLOAD_HEALTH_DELAY_MS = 1500.0
LONG_STREAM_S = 3.5
#: The emulated servers: Llama-3.1-8B on an H100 (knee far above the bench's ~5 sequences per server),
#: ``time_scale`` times slower so a 3.5-s stream is ~150 tokens. With fast-test (knee at 4 sequences)
#: the 4 servers left when cell a fails could not carry 40 req/s with 10 % long streams: batches past
#: the knee slowed every step, streams lasted longer, queues filled and servers answered 429 — the
#: bench measured its own overload, not the fault (first full run, kept in the closing note).
PROFILE = "llama-8b-h100"


def long_stream_tokens(time_scale: float, batch: int = 5, profile: str = PROFILE, seconds: float = LONG_STREAM_S) -> int:
    """Tokens that make a ``seconds`` stream (~3.5 s) on the emulated servers (``profile`` at ``time_scale``)."""
    from dlb.emulator.profile import BUILTIN_PROFILES

    return max(1, round(seconds / (time_scale * BUILTIN_PROFILES[profile].step_time(batch))))


def request_mix(host: str, port: int, max_tokens: int, long_tokens: int) -> list[tuple[float, str, bytes]]:
    from dlb.bench.loadgen import build_request

    def chat(tokens: int, stream: bool, path: str = "/v1/chat/completions") -> bytes:
        body: dict[str, Any] = {"model": "dlb-emulated", "max_tokens": tokens}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = "hi"
        if stream:
            body["stream"] = True
        return build_request(host, port, path, json.dumps(body).encode())

    bodies = {"chat": chat(max_tokens, False), "stream": chat(max_tokens, True), "long": chat(long_tokens, True),
              "completion": chat(max_tokens, False, "/v1/completions"), "completion_stream": chat(max_tokens, True, "/v1/completions")}
    return [(w, kind, bodies[kind]) for w, kind in MIX]


@dataclass(frozen=True)
class FaultLoad:
    """The traffic around one injected fault and its timing (``dlb bench faults``'s options, one row's worth)."""

    rate: float = 40.0
    fault_at_s: float = 6.0
    outage_s: float = 5.0
    after_s: float = 12.0
    max_tokens: int = 8
    seed: int = 1
    cells: Sequence[int] = CELLS
    time_scale: float = 4.0
    #: The DLB routing policy of the endpoint (``Disc-RIF``, ``Flow-Grad``, …: :data:`dlb.core.router.POLICY_NAMES`).
    policy: str = "Disc-RIF"
    #: A flow policy run natively, as a root configured by the control plane runs it: no root service, Envoy
    #: samples the control plane's weights (and retries on each cell's fallback).
    native: bool = False


def run_one(fault: str, mode: str, load: FaultLoad = FaultLoad()) -> dict[str, Any]:
    """Start a data plane, run traffic with ``fault`` injected at ``fault_at_s`` for ``outage_s``; summarise.

    ``cells``: servers per cell (``a``, ``b``, ``c``, … at :data:`ONE_WAY_MS` from ``a``). The emulated
    servers run ``time_scale`` times slower than :data:`PROFILE`, so a 3.5-s stream is ~150 tokens
    rather than ~600 (this shared box's CPU, not the servers, would otherwise be what is measured).
    The control-plane faults and the operator baselines run on a stack with a control plane (leaf agents and
    root under ``--xds``; a baseline's or a ``native`` run's root Envoy over ADS).
    """
    from dlb.testbed.stack import CellSpec, start_data_plane

    rate, fault_at_s, outage_s, after_s = load.rate, load.fault_at_s, load.outage_s, load.after_s
    max_tokens, seed, cells, time_scale = load.max_tokens, load.seed, load.cells, load.time_scale
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    # Disc-RIF by default: with 3.5-s streams in the mix a latency-cost root herds (a cell that served
    # long streams looks slow, all traffic goes elsewhere, and back), so recover_s of latency policies
    # measures that herding as much as the fault.
    from dlb.config.model import OPERATOR_BASELINES
    from dlb.core.router import Mechanism, PolicyConfig

    # An operator baseline is a `weights` plugin over flow endpoints, run as `dlb up` runs it: no root
    # service, the root Envoy configured by the control plane (hub-score's weights come from there).
    baseline = load.policy in OPERATOR_BASELINES
    if baseline and fault in BASELINE_SKIP:
        raise ValueError(f"{fault} under {load.policy}: {BASELINE_SKIP[fault]}")
    pc = PolicyConfig.from_name("Flow-RIF" if baseline else load.policy)
    if load.native and (baseline or pc.mechanism is not Mechanism.FLOW or fault in BASELINE_SKIP):
        raise ValueError(f"native runs a DLB flow policy with no root service, not {load.policy} under {fault}")
    envoy_only = baseline or load.native  # the root Envoy alone routes, configured by the control plane
    endpoint = {"name": "chat", "match": {"prefix": "/v1/"},
                # Error aversion at DLB's defaults, as a user gets it.
                "policy": {"mechanism": pc.mechanism.value, "cost": pc.cost.value},
                "latency_prior": {"a_s": 0.2, "b_s": 0.02, "c": 8, "s": 2}}
    names = [chr(ord("a") + i) for i in range(len(cells))]
    specs = [CellSpec(n, servers=k, emulator={"profile": PROFILE, "time_scale": time_scale})
             for n, k in zip(names, cells, strict=True)]
    one_way = {"a": {n: ONE_WAY_MS[i] if i < len(ONE_WAY_MS) else 20.0 * i for i, n in enumerate(names) if i > 0}}
    # DLB's default probe settings (stale after 1 s; the test stack's 600 ms measured this shared box's
    # CPU starvation — a root's probe loop running late — as "no usable cell" replies).
    for attempt in range(3):
        try:
            plane = start_data_plane(specs, "a", endpoint, one_way_ms=one_way, leaf_ext_proc=(mode == "ext_proc"),
                                     probe={"period_ms": 20, "timeout_ms": 200, "stale_after_ms": 1000, "backoff_max_ms": 500},
                                     control_plane=envoy_only or fault.startswith("control_plane"),
                                     control_planes=2 if fault == "control_plane_replica" else 1,
                                     root_envoys=2 if fault == "root_envoy_replica" else 1,
                                     leaf_replicas=2 if fault in REPLICA_FAULTS else 1,
                                     plugins=({"type": load.policy},) if baseline else (),
                                     root_service=not envoy_only, root_envoy_xds=envoy_only)
            break
        except (RuntimeError, TimeoutError, OSError):
            # A free port taken by another process between our pick and the child's bind (a shared box:
            # seen once in a full run, a leaf's metrics port). A fresh plane gets fresh ports.
            if attempt == 2:
                raise
    try:
        _wait_ready(plane, names, envoy_only)
        host, port = plane.root_url
        mix = request_mix(host, port, max_tokens, long_stream_tokens(time_scale))
        inject, restore = _fault_actions(plane, fault)
        load_start = os.getloadavg()[0]  # the box's load beside each run's counts (a shared box starves parts)
        origin = time.monotonic() + 0.2
        watch = _CellWatch(plane, fault == "cell_overload")
        done_at: list[float] = []
        try:
            samples = asyncio.run(traced_open_loop(host, port, mix, rate, fault_at_s + outage_s + after_s, seed,
                                                   [(fault_at_s, inject), (fault_at_s + outage_s, restore)], origin,
                                                   done_at=done_at))
        finally:
            watch.stop()
        exited = done_at[0] if fault == "root_envoy_replica" and done_at else None  # its inject returns once reaped
        row = summarise(samples, fault, mode, rate, fault_at_s, fault_at_s + outage_s, exited_at=exited)
        row["policy"] = load.policy
        row["loadavg_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
        if fault == "leaf_replica_freeze":
            row.update(stalls(samples, fault_at_s, fault_at_s + outage_s))
            row["verdict"] = verdict(row)
        if watch.on:
            row["envoy_min_healthy"], row["cell_load"] = watch.min_healthy, watch.mean_load()
            row["servers_a"] = len(plane.emulators["a"])
            row["verdict"] = verdict(row)
        return row
    finally:
        frozen: list[Any] = []
        if fault == "leaf_agent_freeze":
            frozen = [plane.leaves["a"]]
        elif fault == "leaf_replica_freeze":
            frozen = [*plane.more_leaf_envoys.get("a", [])[:1], *plane.more_leaves.get("a", [])[:1]]
        for p in frozen:
            try:
                os.kill(p.pid, signal.SIGCONT)  # never leave a stopped child behind
            except (OSError, AssertionError):
                pass
        plane.close()


def _wait_ready(plane: Any, names: list[str], envoy_only: bool, timeout_s: float = 30.0) -> None:
    """Until the root can use every cell (at most ``timeout_s``): the root service says so, or, with no
    root service (a baseline, a native run), the root Envoy's clusters count every host healthy and a request answers 200."""
    from dlb.testbed.stack import metric_value, request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not envoy_only:
            m = plane.root_metrics()
            if all(metric_value(m, "dlb_root_cell_usable", endpoint="chat", cell=c) == 1.0 for c in names):
                return
        else:
            try:
                stats = plane.root_envoy.stats(r"\.membership_(healthy|total)$")
                host, port = plane.root_url
                if all(stats[k] == stats[k.replace("_healthy", "_total")] for k in stats if k.endswith("_healthy")) \
                        and request(host, port, timeout=5)[0] == 200:
                    return
            except OSError:
                pass
        time.sleep(0.1)


class _CellWatch:
    """For the overload row: every 0.25 s, how many servers cell ``a``'s leaf Envoy counts healthy and how
    full the servers' batches are (read from the in-process emulators' engines)."""

    def __init__(self, plane: Any, on: bool) -> None:
        import threading

        self.plane, self.on = plane, on
        self.min_healthy = len(plane.emulators["a"])
        self.loads: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if on else None
        if self._thread is not None:
            self._thread.start()

    def _run(self) -> None:
        envoy, emus = self.plane.leaf_envoys["a"], self.plane.emulators["a"]
        while not self._done.wait(0.25):
            try:
                stat = envoy.stats(r"^cluster\.servers\.membership_healthy$").get("cluster.servers.membership_healthy")
            except OSError:
                continue
            if stat is not None:
                self.min_healthy = min(self.min_healthy, int(stat))
            if any(e.server.faults.slowdown > 1.0 for e in emus):  # the outage: the cell is slow
                eng = [e.server.engine for e in emus]
                self.loads.append(sum(len(x.running) for x in eng) / sum(x.max_batch for x in eng))

    def mean_load(self) -> float | None:
        return round(sum(self.loads) / len(self.loads), 3) if self.loads else None

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)


#: Counts reported as min/median/max over the runs of a row.
SPREAD = ("sent", "failed", "inflight_at_fault", "cut_streams", "refused", "failed_new", "new_fail_window_s", "detect_s", "recover_s")


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from its runs: each count as ``[min, median, max]`` (``recover_s`` None if any run never
    recovered), the verdict "pass" only if every run passed (else the first failing run's)."""
    import statistics

    row: dict[str, Any] = {k: runs[0][k] for k in ("fault", "mode", "policy", "outage_s") if k in runs[0]}
    row["runs"] = len(runs)
    for k in SPREAD:
        vals = [r[k] for r in runs]
        row[k] = None if any(v is None for v in vals) else [min(vals), statistics.median(vals), max(vals)]
    for k in ("envoy_min_healthy", "cell_load", "stalled", "stall_window_s"):
        vals = [r[k] for r in runs if r.get(k) is not None]
        if vals:
            row[k] = [min(vals), statistics.median(vals), max(vals)]
    failing = [r["verdict"] for r in runs if r["verdict"] != "pass"]
    row["verdict"] = failing[0] if failing else "pass"
    row["run_rows"] = runs
    return row


def table(rows: list[dict[str, Any]]) -> str:
    cols = ("policy", "fault", "mode", "outage_s", "runs", *SPREAD, *(["stall_window_s"] if any("stall_window_s" in r for r in rows) else []),
            "verdict")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("/".join(map(str, r[c])) if isinstance(r.get(c), list) else str(r.get(c)) for c in cols) + " |"
              for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from dlb.config.model import OPERATOR_BASELINES
    from dlb.core.router import POLICY_NAMES, Mechanism

    faults = args.faults.split(",") if args.faults else list(FAULTS)
    modes = args.modes.split(",") if args.modes else list(MODES)
    policies = args.policy.split(",")
    for f in faults:
        if f not in FAULTS:
            raise UsageError(f"--faults: unknown fault {f!r}; one of {', '.join(FAULTS)}")
    for m in modes:
        if m not in MODES:
            raise UsageError(f"--modes: unknown mode {m!r}; one of {', '.join(MODES)}")
    for pol in policies:
        if pol not in (*POLICY_NAMES.values(), *OPERATOR_BASELINES):
            raise UsageError(f"--policy: unknown policy {pol!r}; one of {', '.join((*POLICY_NAMES.values(), *OPERATOR_BASELINES))}")
    if args.runs < 1:
        raise UsageError(f"--runs: at least 1, got {args.runs}")
    flow = {n for (mechanism, _), n in POLICY_NAMES.items() if mechanism is Mechanism.FLOW}
    if args.native and not set(policies) <= flow:
        raise UsageError(f"--native: flow policies only ({', '.join(sorted(flow))}), got {args.policy}")
    cells = _cells(args.cells)
    record = harness.start()  # the code that runs (a commit made while the matrix runs must not be recorded)
    rows = []
    for pol in policies:
        for f in faults:
            for m in modes:
                outage = max(args.outage_s, OUTAGE_S.get(f, 0.0))
                after = args.after_s if args.duration is None else args.duration - args.fault_at_s - outage
                if after < 3.0:
                    raise UsageError(f"--duration: {args.duration} s leaves {after:g} s after the {outage:g}-s outage of {f} "
                                     f"(starting at --fault-at-s {args.fault_at_s:g}); at least 3 s are needed to see recovery")
                if (pol in OPERATOR_BASELINES or args.native) and f in BASELINE_SKIP:
                    print(f"dlb bench faults: {f} skipped under {pol}: {BASELINE_SKIP[f]}", flush=True)
                    rows.append({"fault": f, "mode": m, "policy": pol, "outage_s": outage, "runs": 0,
                                 "verdict": f"skipped: {BASELINE_SKIP[f]}"})
                    continue
                runs = []
                for k in range(args.runs):
                    r = run_one(f, m, FaultLoad(args.rate, args.fault_at_s, outage, after, max_tokens=args.max_tokens, seed=args.seed + k,
                                                cells=cells, time_scale=args.time_scale, policy=pol, native=args.native))
                    r["outage_s"] = outage
                    print(json.dumps(r), flush=True)
                    runs.append(r)
                rows.append(spread(runs))
    print(table(rows))
    out = {"created_unix": int(time.time()), "rate_rps": args.rate, "max_tokens": args.max_tokens,
           "fault_at_s": args.fault_at_s, "runs": args.runs, "policies": policies, "native": args.native,
           "outage_s": args.outage_s, "duration_s": args.duration, "after_s": args.after_s, "time_scale": args.time_scale, "profile": PROFILE,
           "long_stream_tokens": long_stream_tokens(args.time_scale), "mix": {k: w for w, k in MIX},
           "cells": {chr(ord("a") + i): k for i, k in enumerate(cells)}, "rows": rows}
    targets = [harness.Target(f"{r['fault']} ({r['policy']}, {r['mode']}): {VERDICT_RULE}", r["verdict"] == "pass", r["verdict"])
               for r in rows if r["runs"]]
    return harness.finish(record, out, targets, json_path=args.json)


def _cells(text: str) -> list[int]:
    try:
        cells = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--cells: comma-separated server counts, got {text!r}") from None
    if len(cells) < 2 or min(cells) < 1:
        raise UsageError(f"--cells: at least two cells of at least one server each, got {text!r}")
    return cells
