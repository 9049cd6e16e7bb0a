"""gRPC core's side of DLB's listener bounds (``dlb.service.grpc_bounds``), on a real grpc.aio server.

A peer that connects and never handshakes was held 120 s, and connections were unbounded: 1,500 of them
to a leaf's probe port took its file descriptors and its cell out of service. Here, with the bounds the
leaf's servers are built with: such a peer is closed at the handshake timeout, and connections past the
cap are closed at accept while a real client still gets through once the idle ones are gone.
"""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from dlb.service import grpc_bounds


def _closed_within(sock: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading past its SETTINGS), or None if it stays open."""
    sock.settimeout(0.2)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_a_silent_peer_is_closed_at_the_handshake_timeout_and_connections_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_bounds, "HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(grpc_bounds, "MAX_CONNECTIONS", 4)

    async def run() -> None:
        server = grpc.aio.server(options=grpc_bounds.bounded_options(16))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # silent: no preface, nothing
            closed = await asyncio.gather(*(asyncio.to_thread(_closed_within, s, 5.0) for s in socks))  # s since connect
            early = [c for c in closed if c is not None and c < 0.5]
            late = [c for c in closed if c is not None and c >= 0.5]
            assert len(early) == 4, closed  # past the cap: closed at accept
            assert len(late) == 4 and max(late) < 4.5, closed  # the silent ones: at the 1-s handshake timeout
            for s in socks:
                s.close()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:  # a real client still gets in
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary("/dlb.Test/Nothing")(b"", timeout=5)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await server.stop(0)

    asyncio.run(run())


def test_the_leafs_limits_are_what_its_metric_says() -> None:
    opts = dict(grpc_bounds.bounded_options(64))
    samples = grpc_bounds.limit_samples()
    assert opts["grpc.server_handshake_timeout_ms"] == samples["handshake_timeout_s"] * 1000
    assert opts["grpc.max_allowed_incoming_connections"] == samples["max_connections"]
    assert opts["grpc.max_connection_idle_ms"] == samples["max_connection_idle_s"] * 1000
