"""Leaf replicas found in DNS (``cells[].leaf.replicas: dns``): every address the probe name resolves to is
one replica, probed on its own and merged into its cell (:mod:`dlb.core.leaf_replicas`).

Why DNS: in Kubernetes the leaf replicas are the pods of one Deployment, whose addresses change with
every rolling update; a headless Service (or external-dns publishing it) names all of them, where a
load-balanced Service would hand every probe to one pod. A name that fails to resolve keeps its last
addresses (a DNS hiccup must not empty a cell); a pod that is gone fails its probes and leaves the
aggregate, and the next resolution drops it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence

from dlb.log import get_logger
from dlb.probe.target import ProbeTarget

log = get_logger("dlb.probe.replica_dns")

#: ``(host, port) -> addresses``: every IP the name has now (raises OSError when it has none).
Resolver = Callable[[str, int], Awaitable[list[str]]]
#: How often a root re-resolves its replica names: a new pod of a rolling update is probed within this.
PERIOD_S = 2.0


async def resolve_all(host: str, port: int) -> list[str]:
    """Every distinct IP of ``host`` (A and AAAA), as ``getaddrinfo`` returns them."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(ipaddress.ip_address(info[4][0])) for info in infos})


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


async def resolve_targets(targets: Sequence[ProbeTarget], resolver: Resolver,
                          last: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The IPs of every ``resolve`` target's host; one that fails or has none keeps its ``last`` ones."""
    out: dict[str, tuple[str, ...]] = {}
    for t in targets:
        if not t.resolve or t.address in out:
            continue
        host, port = _split(t.address)
        try:
            ips = tuple(sorted(set(await resolver(host, port))))
        except OSError as e:
            ips = ()
            log.warning("replica_dns_failed", cell=t.name, name=host, error=str(e)[:200])
        out[t.address] = ips or tuple(last.get(t.address, ()))
    return out


def expand(targets: Sequence[ProbeTarget], resolved: Mapping[str, tuple[str, ...]]) -> list[ProbeTarget]:
    """One target per resolved address of each ``resolve`` target (replicas numbered in address order);
    a name not resolved yet is probed by name, as one replica."""
    out: list[ProbeTarget] = []
    for t in targets:
        ips = resolved.get(t.address, ()) if t.resolve else ()
        if not ips:
            out.append(t)
            continue
        port = _split(t.address)[1]
        out += [dataclasses.replace(t, address=f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}", replica=k, resolve=False,
                                    tls_name=_split(t.address)[0]) for k, ip in enumerate(ips)]
    return out
