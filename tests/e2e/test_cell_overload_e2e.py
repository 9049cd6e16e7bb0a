"""A cell under overload stays a cell: real root and leaf Envoys, a leaf agent, emulated servers slowed
to a crawl and held at 95 % of their batch slots.

Rule: while its servers answer, the cell's own leaf Envoy never takes them out of rotation (its active
health check and outlier detection are sized to an inference server under load, not to an idle one),
the leaf agent never reports fewer healthy servers than there are, and the cell serves at least 99 % of
what it accepts. Before the sizing, a 1-s health-check timeout with 2 failures and outlier detection
that could eject every server turned a slow cell into ``503 no_healthy_upstream`` for all its traffic.

The load generator, the emulators and the probes share this process (its GIL), so ``/health`` answers
as late as a busy vLLM API server's does; the test reports the latency it measured.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import urllib.request

import pytest
from bounded_wait import until

from dlb.testbed.stack import CellSpec, metric_value, start_data_plane

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]

SERVERS = 2
MAX_BATCH = 16
#: 95 % of the cell's batch slots busy at all times (closed loop): the servers run their heaviest steps.
CLIENTS = round(0.95 * SERVERS * MAX_BATCH)
RUN_S = 20.0
#: How late the servers answer ``/health``: past the old 1-s check timeout, within the sized one.
HEALTH_DELAY_MS = 1500.0


async def _closed_loop(host: str, port: int, clients: int, run_s: float) -> dict[str, int]:
    """``clients`` connections each sending streamed chats back to back for ``run_s``; counts by outcome."""
    body = (b'{"model":"dlb-emulated","stream":true,"max_tokens":24,"messages":[{"role":"user","content":"overload"}]}')
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    counts: dict[str, int] = {}
    stop = time.monotonic() + run_s

    async def one_client() -> None:
        reader = writer = None
        while time.monotonic() < stop:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                writer.write(head + body)
                status_line = await asyncio.wait_for(reader.readline(), 60)
                status = int(status_line.split()[1])
                chunked, length = False, 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    k, _, v = line.decode().partition(":")
                    if k.lower() == "transfer-encoding" and "chunked" in v:
                        chunked = True
                    elif k.lower() == "content-length":
                        length = int(v)
                data = b""
                if chunked:
                    while True:
                        size = int((await reader.readline()).split(b";")[0], 16)
                        data += await reader.readexactly(size + 2)
                        if size == 0:
                            break
                else:
                    data = await reader.readexactly(length)
                key = "ok" if status == 200 and (not chunked or b"data: [DONE]" in data) else f"{status}"
                if status != 200:
                    at = data.find(b'"code":')
                    key += " " + (data[at + 7:].split(b",")[0].strip(b' "}').decode() if at >= 0 else "")
            except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, TimeoutError) as e:
                key = f"broken {type(e).__name__}"
                if writer is not None:
                    writer.close()
                reader = writer = None
            counts[key] = counts.get(key, 0) + 1
        if writer is not None:
            writer.close()

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return counts


def test_slow_cell_at_95_percent_load_keeps_every_server_and_serves_99_percent() -> None:
    endpoint = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
                "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1}}
    plane = start_data_plane([CellSpec("a", servers=SERVERS, emulator={"max_batch": MAX_BATCH, "max_queue": 64})], "a",
                             endpoint, leaf_ext_proc=False,
                             probe={"period_ms": 20, "timeout_ms": 200, "stale_after_ms": 1000, "backoff_max_ms": 500})
    try:
        envoy = plane.leaf_envoys["a"]
        until(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0,
              "the root has probed cell a")
        emus = plane.emulators["a"]
        for emu in emus:  # slow servers: every step 8 times its measured time, /health answered as late as HEALTH_DELAY_MS
            emu.set_faults(slowdown=8.0, health_delay_ms=HEALTH_DELAY_MS)
        lowest: dict = {"envoy_healthy": SERVERS, "agent_healthy": SERVERS, "root_usable": 1.0}
        health_ms: list[float] = []
        done = threading.Event()

        def watch_views() -> None:  # what Envoy, the agent and the root think of the cell, every 0.1 s
            while not done.is_set():
                stats = envoy.stats(r"^cluster\.servers\.membership_healthy$")
                lowest["envoy_healthy"] = min(lowest["envoy_healthy"], int(stats.get("cluster.servers.membership_healthy", 0)))
                m = plane.leaf_metrics("a")
                healthy = int(metric_value(m, "dlb_leaf_healthy_servers"))
                if healthy < SERVERS and "agent_dip" not in lowest:  # why, for the failure message
                    lowest["agent_dip"] = [ln for ln in m.splitlines() if ln.startswith(("dlb_leaf_server_", "dlb_leaf_failed",
                                                                                         "dlb_leaf_envoy"))]
                lowest["agent_healthy"] = min(lowest["agent_healthy"], healthy)
                r = plane.root_metrics()
                lowest["root_usable"] = min(lowest["root_usable"], metric_value(r, "dlb_root_cell_usable", endpoint="chat", cell="a"))
                time.sleep(0.1)

        def time_health() -> None:  # what the leaf Envoy's health check sees: GET /health, timed
            while not done.is_set():
                for emu in emus:
                    t0 = time.monotonic()
                    with urllib.request.urlopen(f"http://{emu.address}/health", timeout=30) as resp:
                        resp.read()
                    health_ms.append(1000 * (time.monotonic() - t0))

        watchers = [threading.Thread(target=f, daemon=True) for f in (watch_views, time_health)]
        for w in watchers:
            w.start()
        host, port = plane.root_url
        try:
            counts = asyncio.run(_closed_loop(host, port, CLIENTS, RUN_S))
        finally:
            done.set()
            for w in watchers:
                w.join(30)
        sent = sum(counts.values())
        health_ms.sort()
        print({"counts": counts, "lowest": lowest, "health_ms_p50": round(statistics.median(health_ms), 1),
               "health_ms_p99": round(health_ms[int(0.99 * (len(health_ms) - 1))], 1), "health_ms_max": round(health_ms[-1], 1),
               "hc_failures": envoy.stats(r"^cluster\.servers\.(health_check\.failure|outlier_detection\.ejections_active)$")})
        assert sent > 100, counts
        assert lowest["envoy_healthy"] == SERVERS, (lowest, counts)
        assert lowest["agent_healthy"] == SERVERS, (lowest, counts)
        assert lowest["root_usable"] == 1.0, (lowest, counts)
        assert counts.get("ok", 0) >= 0.99 * sent, counts
    finally:
        plane.close()


def test_a_cell_its_envoy_takes_out_reports_no_healthy_replica_and_comes_back() -> None:
    """The agent's healthy servers are its Envoy's: a server that stops answering ``/health`` (its
    ``/metrics`` still answers, so the agent alone would keep it) is out once the Envoy's checks time
    out, and the root stops using the cell; it is back when the Envoy's next check passes."""
    endpoint = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
                "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1}}
    plane = start_data_plane([CellSpec("a", servers=1), CellSpec("b", servers=1)], "a", endpoint, leaf_ext_proc=False)
    try:
        envoy = plane.leaf_envoys["a"]

        def usable() -> float:
            return metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a")

        until(lambda: usable() == 1.0, "the root has probed cell a")
        plane.emulators["a"][0].set_faults(health_delay_ms=60_000.0)  # silent: 3 checks time out
        until(lambda: envoy.stats(r"^cluster\.servers\.membership_healthy$").get("cluster.servers.membership_healthy") == "0",
              "the leaf Envoy took the server out", timeout=40)
        until(lambda: metric_value(plane.leaf_metrics("a"), "dlb_leaf_healthy_servers") == 0.0, "the agent follows", timeout=5)
        until(lambda: usable() == 0.0, "the root stops using cell a", timeout=5)
        plane.emulators["a"][0].set_faults(health_delay_ms=0.0)
        until(lambda: usable() == 1.0, "cell a is usable again", timeout=20)
    finally:
        plane.close()
