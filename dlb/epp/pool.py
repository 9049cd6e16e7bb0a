"""The pool's endpoints: the config cell's servers, static or DNS names re-resolved while serving, or an
InferencePool's ready pods (:mod:`dlb.epp.k8s`), which replace the cell's servers.

Why re-resolve here: a GIE pool is a set of pods that comes and goes; a headless Service's name has one
address per ready pod. The leaf agent follows such changes over xDS from the control plane; an EPP
runs without one, so it asks DNS itself, off the request path (the resolver runs in asyncio's executor).
A name that fails to resolve keeps its last addresses: a DNS hiccup must not empty the pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence

from dlb.config import Config
from dlb.config.discovery import dns_names, expand
from dlb.config.hostport import HostPort, parse_hostport
from dlb.config.model import Server
from dlb.ext_proc.leaf_setup import rank_addresses
from dlb.ext_proc.leaf_state import LeafState
from dlb.log import get_logger

log = get_logger("dlb.epp")

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_async(host: str, port: int) -> list[str]:
    """Every IP of ``host`` (A and AAAA) from the system resolver; OSError when it has none."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(i[4][0]) for i in infos})


def pool_names(cfg: Config, cell: str) -> dict[str, int]:
    """The DNS names among the cell's servers, each with a port."""
    hosts = {s.address.host for s in cfg.cell(cell).servers}
    return {h: p for h, p in dns_names(cfg).items() if h in hosts}


def pool_servers(cfg: Config, cell: str, resolved: Mapping[str, Sequence[str]]) -> list[tuple[str, float]]:
    """``(ip:port, weight)`` of every endpoint once the names are ``resolved`` (names with no address are left out)."""
    out: list[tuple[str, float]] = []
    for s in expand(cfg, resolved).cell(cell).servers:
        try:
            addresses = rank_addresses(s.address.host, s.address.port, s.dp.ranks if s.dp else 1)
        except ValueError:  # still a name: nothing resolved for it yet
            continue
        out += [(a, float(s.weight)) for a in addresses]
    return out


async def follow_dns(cfg: Config, cell: str, state: LeafState, period_s: float, resolve: Resolver = resolve_async,
                     on_change: Callable[[], object] = lambda: None) -> None:
    """Every ``period_s``, re-resolve the pool's names and apply a changed endpoint set to ``state`` (then ``on_change``)."""
    names = pool_names(cfg, cell)
    if not names:
        return
    last: dict[str, list[str]] = {}
    while True:
        await asyncio.sleep(period_s)
        for host, port in names.items():
            try:
                last[host] = await resolve(host, port)
            except OSError as exc:
                log.warning("epp_dns_failed", host=host, error=str(exc))
        servers = pool_servers(cfg, cell, last)
        if servers and [a for a, _ in servers] != [s.address for s in state.servers]:
            state.set_servers(servers)
            on_change()
            log.info("epp_pool_changed", endpoints=[a for a, _ in servers])


def with_pool(cfg: Config, cell: str, endpoints: tuple[str, ...]) -> Config:
    """``cfg`` whose ``cell`` has the InferencePool's endpoints as its servers (its own are not resolved)."""
    servers = tuple(Server(hp) for hp in map(parse_hostport, endpoints) if hp is not None)
    # No ready pod yet: a leaf state needs one server; this one is never picked (EndpointPicker.empty answers 503).
    servers = servers or (Server(HostPort("0.0.0.0", 1)),)
    cells = tuple(dataclasses.replace(c, servers=servers, replicas=len(servers)) if c.name == cell else c for c in cfg.cells)
    return dataclasses.replace(cfg, cells=cells)
