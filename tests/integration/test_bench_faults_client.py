"""``dlb bench faults``' client against a real socket server: how a request lost before any answer is labelled."""

from __future__ import annotations

import asyncio
import time

from dlb.bench.faults import KEPT_ALIVE, Sample, traced_open_loop


def test_a_request_lost_on_a_kept_alive_connection_is_told_apart_from_a_new_connections_loss() -> None:
    """A server that answers each connection's first request (keep-alive) and drops the connection when
    the second arrives, unanswered: every second request of a connection fails (status 0) on a kept-alive
    connection, the way a request written just after a root Envoy replica died fails — the row's failure
    code must say so. A request whose own new connection is dropped stays status 0 with no reason."""
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-dlb-server: a-0\r\n\r\nok"

    async def main(drop_first: bool) -> list[Sample]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served = 0
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                if served or drop_first:
                    break
                writer.write(ok)
                await writer.drain()
                served += 1
            writer.transport.abort()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        try:
            return await traced_open_loop("127.0.0.1", port, [(1.0, "chat", request)], 4.0, 2.0, 1, [],
                                          time.monotonic())
        finally:
            server.close()

    samples = asyncio.run(main(False))
    failed = [s for s in samples if s.status != 200]
    assert failed and len(samples) - len(failed) >= 2
    assert all(s.status == 0 and s.server == KEPT_ALIVE for s in failed), failed
    fresh = asyncio.run(main(True))
    assert fresh and all(s.status == 0 and s.server == "" for s in fresh), fresh
