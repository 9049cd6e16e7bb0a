"""What one xDS client can make the control plane keep, log or show is bounded (issue 14 row 6).

Measured before: 50 ADS streams with 1 MB node ids and one stream subscribing 5,000 bogus type URLs x
100 names kept +188 MB and +107 MB after disconnect, wrote 100 MB of logs, and made ``/metrics`` 201 MB
and ``/status`` 86 MB. Each test drives the real gRPC server with the plain xds-protos stubs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
from bounded_wait import until_in_loop

from dlb.xds import Snapshot, SnapshotCache, StatusServer, XdsServer, types
from dlb.xds.status import SHOWN_NAMES, StatusRegistry
from dlb.xds.stream import StreamLimits
from dlb.xds.testing import RawStream, ack, eds_cluster, nack, node, sotw_request

CDS = types.CLUSTER
BOGUS = "type.googleapis.com/bogus.T"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def server(status: StatusRegistry | None = None) -> AsyncIterator[tuple[XdsServer, grpc.aio.Channel, StatusServer]]:
    cache = SnapshotCache()
    cache.set_snapshot("n1", Snapshot.build([eds_cluster("c1")], extra_types=[CDS]))
    xds = XdsServer(cache, status=status)
    port = await xds.start()
    http = StatusServer(xds.status)
    await http.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        yield xds, channel, http
    finally:
        await channel.close()
        await http.stop()
        await xds.stop(None)


async def closed_with(s: RawStream) -> grpc.StatusCode:
    """Read until the server ends the stream; the status it ended it with."""
    with contextlib.suppress(grpc.aio.AioRpcError, EOFError):
        while True:
            await s.recv()
    return await s.call.code()


async def get(port: int, path: str) -> bytes:
    def fetch() -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.read()

    return await asyncio.to_thread(fetch)  # the server runs on this loop


def test_huge_node_ids_are_refused_and_leave_nothing_behind() -> None:
    async def go() -> tuple[list[grpc.StatusCode], dict, bytes]:
        async with server() as (_, channel, http):
            codes = []
            for i in range(6):  # 100 KB ids pass gRPC's message limit and meet ours; a 1 MB request meets gRPC's
                s = RawStream(channel)
                await s.send(sotw_request(CDS, node=node(f"{i}" + "x" * (100_000 if i < 5 else 1 << 20))))
                codes.append(await closed_with(s))
                await s.close()
            return codes, json.loads(await get(http.port, "/status")), await get(http.port, "/metrics")

    codes, status, metrics = run(go())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 5 + [grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert status["nodes"] == {} and status["limit_hits"] == {"node_id_bytes": 5}
    assert b'dlb_xds_limit_hits_total{limit="node_id_bytes"} 5.0' in metrics and len(metrics) < 10_000


def test_a_stream_subscribing_many_bogus_types_is_closed_at_the_type_limit() -> None:
    limit = StreamLimits().types

    async def go() -> tuple[grpc.StatusCode, dict, int]:
        async with server() as (_, channel, http):
            s = RawStream(channel)
            await s.send(sotw_request(CDS, node=node("n1")))
            await s.send(ack(await s.recv()))
            for t in range(5000):
                await s.send(sotw_request(f"{BOGUS}{t}", [f"name-{k}" for k in range(100)]))
            code = await closed_with(s)
            await s.close()
            return code, json.loads(await get(http.port, "/status")), len(await get(http.port, "/metrics"))

    code, status, metrics_len = run(go())
    # The server ends it RESOURCE_EXHAUSTED; a client still writing thousands of requests may see its own INTERNAL.
    assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL)
    assert len(status["nodes"]["n1"]["types"]) <= limit and status["limit_hits"] == {"types": 1}
    assert metrics_len < 50_000


def test_names_are_bounded_in_count_and_length() -> None:
    lim = StreamLimits()

    async def go() -> list[grpc.StatusCode]:
        out = []
        async with server() as (_, channel, _http):
            for names in ([f"n{k}" for k in range(lim.names + 1)], ["x" * (lim.name_bytes + 1)]):
                s = RawStream(channel)
                await s.send(sotw_request(CDS, node=node("n1")))
                await s.send(sotw_request(types.ENDPOINT, names))
                out.append(await closed_with(s))
                await s.close()
            # the same, spread over requests of one stream (each under the per-request count)
            s = RawStream(channel, delta=True)
            from envoy.service.discovery.v3 import discovery_pb2

            await s.send(discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, node=node("n1")))
            for part in range(3):
                await s.send(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=types.ENDPOINT, resource_names_subscribe=[f"p{part}-{k}" for k in range(lim.names // 2)]))
            out.append(await closed_with(s))
            await s.close()
        return out

    assert run(go()) == [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT,
                         grpc.StatusCode.RESOURCE_EXHAUSTED]


def test_status_shows_a_bounded_list_of_names_and_clips_client_text() -> None:
    async def go() -> dict:
        async with server() as (_, channel, http):
            s = RawStream(channel)
            await s.send(sotw_request(CDS, node=node("n1")))
            resp = await s.recv()
            await s.send(nack(resp, "v" * 100_000, "r" * 300_000))
            await s.send(sotw_request(types.ENDPOINT, [f"name-{k}" for k in range(5000)]))
            await s.send(sotw_request(CDS, [], version="v" * 100_000, nonce=resp.nonce))  # an ACK with a huge version
            await s.barrier()
            return json.loads(await get(http.port, "/status"))

    st = run(go())["nodes"]["n1"]["types"]
    eds = st[types.short(types.ENDPOINT)]
    assert len(eds["subscribed"]) == SHOWN_NAMES and eds["subscribed_count"] == 5000
    cds = st[types.short(CDS)]
    assert len(cds["last_nack_reason"]) < 2000
    assert len(json.dumps(st)) < 50_000


def test_a_disconnected_node_is_forgotten_after_the_grace_period() -> None:
    clock = Clock()
    status = StatusRegistry(grace_s=60.0, clock=clock)

    async def go() -> tuple[list[str], list[str], list[str]]:
        async with server(status) as (_, channel, http):
            s = RawStream(channel)
            await s.send(sotw_request(CDS, node=node("n1")))
            await s.recv()
            await s.close()
            await until_in_loop(lambda: status.nodes["n1"].streams == 0, "the closed stream counted", period=0.01)
            before = list(json.loads(await get(http.port, "/status"))["nodes"])
            clock.now += 59
            within = list(json.loads(await get(http.port, "/status"))["nodes"])
            clock.now += 2
            return before, within, list(json.loads(await get(http.port, "/status"))["nodes"])

    assert run(go()) == (["n1"], ["n1"], [])


def test_many_stream_limits_of_the_server() -> None:
    async def go() -> list[grpc.StatusCode | None]:
        cache = SnapshotCache()
        cache.set_snapshot("n1", Snapshot.build([eds_cluster("c1")], extra_types=[CDS]))
        xds = XdsServer(cache, limits=StreamLimits(streams=2))
        port = await xds.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            streams = []
            for _ in range(2):
                streams.append(s := RawStream(channel))
                await s.send(sotw_request(CDS, node=node("n1")))
                await s.recv()
            streams.append(RawStream(channel))  # opened only once the first two are counted
            await streams[2].send(sotw_request(CDS, node=node("n1")))
            third = await closed_with(streams[2])
            for s in streams:
                await s.close()
        await xds.stop(None)
        return [third, xds.status.limit_hits.get("streams")]  # type: ignore[list-item]

    assert run(go()) == [grpc.StatusCode.RESOURCE_EXHAUSTED, 1]


def test_the_names_all_streams_subscribe_share_one_byte_budget() -> None:
    """The per-stream limits multiplied by the stream count: a stranger's 40 streams held +266 MB, none past a
    limit. A stream that would take the server past ``subscribed_bytes`` is closed; a closed stream's bytes
    come back."""
    name = "n" * 99

    async def go() -> list[object]:
        cache = SnapshotCache()
        cache.set_snapshot("n1", Snapshot.build([eds_cluster("c1")], extra_types=[CDS]))
        xds = XdsServer(cache, limits=StreamLimits(subscribed_bytes=25_000))
        port = await xds.start()
        out: list[object] = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            first = RawStream(channel)
            await first.send(sotw_request(types.ENDPOINT, [f"{name}{k:03d}" for k in range(120)], node=node("n1")))
            await until_in_loop(lambda: xds.ctx.subscribed_bytes > 0, timeout=20, what="the first stream's names counted")
            out.append(xds.ctx.subscribed_bytes)
            second = RawStream(channel)
            await second.send(sotw_request(types.ENDPOINT, [f"{name}{k:03d}" for k in range(130)], node=node("n2")))
            out.append(await closed_with(second))
            await second.close()
            await first.close()
            await until_in_loop(lambda: xds.ctx.subscribed_bytes == 0, timeout=20, what="the first stream's bytes returned")
            third = RawStream(channel)
            await third.send(sotw_request(types.ENDPOINT, [f"{name}{k:03d}" for k in range(130)], node=node("n3")))
            await until_in_loop(lambda: xds.ctx.subscribed_bytes > 0, timeout=20, what="the third stream's names counted")
            out.append(xds.ctx.subscribed_bytes)
            await third.close()
        await xds.stop(None)
        out.append(xds.status.limit_hits.get("subscribed_bytes"))
        return out

    assert run(go()) == [120 * 102, grpc.StatusCode.RESOURCE_EXHAUSTED, 130 * 102, 1]  # 102-byte names


@pytest.mark.parametrize("field_name", ["id", "cluster"])
def test_node_fields_over_the_limit_name_the_field_not_the_value(field_name: str) -> None:
    async def go() -> str:
        async with server() as (_, channel, _http):
            s = RawStream(channel)
            n = node("n1")
            setattr(n, field_name, "y" * 10_000)
            await s.send(sotw_request(CDS, node=n))
            with contextlib.suppress(grpc.aio.AioRpcError, EOFError):
                while True:
                    await s.recv()
            details = await s.call.details()
            await s.close()
            return details or ""

    details = run(go())
    assert f"node.{field_name}" in details and "yyyy" not in details


def test_the_status_listener_keeps_at_most_its_cap_and_closes_idle_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer opening connections and sending nothing (or a byte now and then) used to keep every one of
    them: aiohttp closes an idle connection after ~1 h. Now 64 at most are kept, the rest closed at accept
    and counted, and an idle one is closed after STATUS_IDLE_S, so the port serves again."""
    import dlb.xds.status as status_mod

    monkeypatch.setattr(status_mod, "STATUS_IDLE_S", 1.0)
    cap = status_mod.STATUS_MAX_CONNECTIONS

    async def go() -> tuple[int, int, bytes, bytes]:
        async with server() as (_, _channel, http):
            held = []
            for _ in range(cap + 36):  # one at a time: each is made before the next arrives
                held.append(await asyncio.open_connection("127.0.0.1", http.port))
                await asyncio.sleep(0.002)
            held[0][1].write(b"GET /hea")  # a drip: half a request line, then nothing
            await asyncio.sleep(0.3)

            async def eof(reader: asyncio.StreamReader) -> bool:  # a connection the server closed reads EOF at once
                try:
                    async with asyncio.timeout(0.2):
                        return await reader.read(1) == b""
                except TimeoutError:
                    return False
                except ConnectionError:
                    return True

            closed = sum(await asyncio.gather(*(eof(r) for r, _ in held)))  # all at once: well inside STATUS_IDLE_S
            refused = http.refused
            await asyncio.sleep(1.5)  # past STATUS_IDLE_S: the held ones, the drip among them, are closed
            assert all(await asyncio.gather(*(eof(r) for r, _ in held)))
            for _, writer in held:
                writer.close()
            return closed, refused, await get(http.port, "/healthz"), await get(http.port, "/metrics")

    closed, refused, health, metrics = run(go())
    assert closed == refused == 36, (closed, refused)
    assert health == b"ok"
    assert b"dlb_xds_status_http_refused_total 36.0" in metrics


def test_node_ids_are_measured_in_bytes_and_must_be_printable() -> None:
    """300 × 'é' (600 bytes) passed the 512-byte limit as 300 characters; an ESC sequence in a node id
    reached /metrics labels raw. Both are refused; a 256-'é' id (512 bytes) is the largest accepted."""

    async def go() -> tuple[list[grpc.StatusCode], dict]:
        async with server() as (_, channel, http):
            codes = []
            for node_id in ("é" * 300, "evil\x1b[31mred"):
                s = RawStream(channel)
                await s.send(sotw_request(CDS, node=node(node_id)))
                codes.append(await closed_with(s))
                await s.close()
            kept = RawStream(channel)
            await kept.send(sotw_request(CDS, node=node("é" * 256)))
            await until_in_loop(lambda: kept.call.done() or "é" * 256 in http.status.nodes, "the 512-byte id on a stream")
            status = json.loads(await get(http.port, "/status"))
            await kept.close()
            return codes, status

    codes, status = run(go())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert status["limit_hits"] == {"node_id_bytes": 2} and list(status["nodes"]) == ["é" * 256]
