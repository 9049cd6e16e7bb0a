"""A ``source: gie`` cell's prober checks the gateway its requests go to, not only the EPP's ``/metrics``.

Rule: while the gateway accepts TCP connections the scrape answers with the pool's figures; once it stops
(killed, the EPP still exporting metrics), the scrape fails naming the gateway, so the root marks the cell
unusable at once instead of sending requests there that fail to connect; back, it answers again.
"""

from __future__ import annotations

import asyncio

import pytest

from dlb.probe.foreign import ForeignProber
from dlb.probe.target import ProbeTarget

pytestmark = pytest.mark.timeout(60)

POOL = b"inference_pool_ready_pods 3\ninference_pool_average_queue_size 2\n"


async def _metrics(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(POOL), POOL))
    await writer.drain()
    writer.close()


async def _accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


def test_a_gie_cell_whose_gateway_stopped_accepting_fails_its_scrape() -> None:
    async def run() -> None:
        epp = await asyncio.start_server(_metrics, "127.0.0.1", 0)
        gateway = await asyncio.start_server(_accept, "127.0.0.1", 0)
        m_port, g_port = epp.sockets[0].getsockname()[1], gateway.sockets[0].getsockname()[1]
        target = ProbeTarget(1, "far", f"127.0.0.1:{m_port}", source="gie",
                             scrape=(f"127.0.0.1:{m_port}", f"127.0.0.1:{g_port}"))
        prober = ForeignProber(target)
        resp = await prober(1.0)
        assert resp.healthy_replicas == 3 and resp.rif == 6.0
        gateway.close()
        await gateway.wait_closed()
        with pytest.raises(ValueError, match=rf"gateway of cell far at 127\.0\.0\.1:{g_port}"):
            await prober(1.0)
        gateway = await asyncio.start_server(_accept, "127.0.0.1", g_port)
        assert (await prober(1.0)).healthy_replicas == 3
        gateway.close()
        epp.close()

    asyncio.run(run())
