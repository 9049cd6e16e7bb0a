"""Shared set-up for the service tests: a DLB config factory, a control plane, an Envoy, stand-in leaves.

Why one copy: the scenario tests (a control plane driving a root Envoy, the root service over xDS, the
mTLS path) each wrote the same YAML builder and the same start/stop pairs; here their set-up is one
thing and their bodies are about the behaviour. ``tests/conftest.py`` offers them as the fixtures
``make_config``, ``control_plane``, ``envoy`` and ``leaves``; the last three are async context managers,
entered inside the test's event loop (``async with control_plane(cfg) as cp: ...``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from dlb.config.model import Config
from dlb.control_plane.service import ControlPlane
from dlb.envoy.binary import EnvoyProcess
from dlb.procutil import free_port


@dataclass
class CellPorts:
    """The ports a cell's config names (its leaf, its probe server, its one server); fresh free ports unless given."""

    leaf: int = field(default_factory=free_port)
    probe: int = field(default_factory=free_port)
    server: int = field(default_factory=free_port)


def config_doc(cells: Mapping[str, CellPorts], endpoints: list[dict[str, Any]], *, roots: Mapping[str, Mapping[str, int]] | None = None,
               network: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A version-1 DLB config on 127.0.0.1: one leaf per cell, roots where ``roots`` says.

    ``roots`` maps a cell to its root's ports (``address``, optionally ``ext_proc``); by default one root in
    cell ``a`` on a free port. ``extra`` adds top-level sections (``probe``, ``tls``).
    """
    roots = roots if roots is not None else {"a": {"address": free_port()}}
    return {
        "version": 1,
        "cells": [{
            "name": n,
            "leaf": {"address": f"127.0.0.1:{p.leaf}", "probe": f"127.0.0.1:{p.probe}"},
            **({"root": {k: f"127.0.0.1:{v}" for k, v in roots[n].items()}} if n in roots else {}),
            "servers": [f"127.0.0.1:{p.server}"],
        } for n, p in cells.items()],
        "network": network if network is not None else {"default_one_way_ms": 5},
        "endpoints": endpoints,
        **extra,
    }


def write_config(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` as YAML (what the services read) and return the path."""
    Path(path).write_text(yaml.safe_dump(doc))
    return Path(path)


@dataclass
class RunningControlPlane:
    """A started control plane and the ports it listens on."""

    cp: ControlPlane
    xds_port: int
    status_port: int


@asynccontextmanager
async def control_plane(config: Config, **options: Any) -> AsyncIterator[RunningControlPlane]:
    """A ControlPlane on 127.0.0.1 (ports picked by the kernel); no probes and no flow loop unless ``options`` say so."""
    cp = ControlPlane(config, **{"probe": False, "flow_loop": False, **options})
    xds_port, status_port = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    try:
        yield RunningControlPlane(cp, xds_port, status_port)
    finally:
        await cp.stop()


@asynccontextmanager
async def envoy(bootstrap: dict[str, Any], folder: str | Path, name: str = "envoy") -> AsyncIterator[EnvoyProcess]:
    """A real Envoy started from ``bootstrap`` (written to ``folder/name.yaml``), stopped on exit; start and stop run off the loop."""
    path = Path(folder) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(bootstrap))
    process = EnvoyProcess(str(path), bootstrap["admin"]["address"]["socket_address"]["port_value"])
    try:
        await asyncio.to_thread(process.start)
        yield process
    finally:
        await asyncio.to_thread(process.stop)


async def start_leaf(name: str, port: int, delay_s: float = 0.0) -> web.AppRunner:
    """An HTTP server on 127.0.0.1:``port`` standing in for cell ``name``'s leaf: every request is answered with the name
    (after ``delay_s``: a cell that holds its requests)."""

    async def handle(_req: web.Request) -> web.Response:
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.Response(text=name)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def split(port: int, n: int, concurrency: int = 16, timeout_s: float = 10.0) -> dict[str, float]:
    """Send ``n`` GETs through the Envoy on ``port``; the fraction answered by each stand-in cell (or ``status-N``)."""
    from collections import Counter

    from aiohttp import ClientSession, ClientTimeout

    counts: Counter[str] = Counter()
    sem = asyncio.Semaphore(concurrency)
    async with ClientSession(timeout=ClientTimeout(total=timeout_s)) as s:
        async def one() -> None:
            async with sem, s.get(f"http://127.0.0.1:{port}/v1/completions") as r:
                counts[await r.text() if r.status == 200 else f"status-{r.status}"] += 1

        await asyncio.gather(*(one() for _ in range(n)))
    return {k: v / n for k, v in counts.items()}


@asynccontextmanager
async def leaves(ports: Mapping[str, int]) -> AsyncIterator[list[web.AppRunner]]:
    """Stand-in leaves (``start_leaf``), one per ``{cell: port}``, cleaned up on exit."""
    runners: list[web.AppRunner] = []
    try:
        for n, p in ports.items():
            runners.append(await start_leaf(n, p))
        yield runners
    finally:
        for r in runners:
            await r.cleanup()
