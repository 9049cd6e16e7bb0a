"""Server discovery, the pure part: a config with DNS-named servers expanded to the addresses found.

Why: in Kubernetes a cell's inference servers are the pods behind a headless Service, whose name has
one A/AAAA record per ready pod. ``servers: ["vllm.cell-a.svc:8000"]`` then means *every* pod, and
the set changes as pods come and go. The control plane resolves such names every
``discovery.dns_period_s`` (:mod:`dlb.control_plane.dns`) and calls :func:`expand`; the expanded
config renders the leaf's ``servers`` cluster as static endpoints, published over EDS, which the leaf
Envoy and the leaf agent (``--xds``) follow. A cell whose ``replicas`` is unset counts the addresses.

No I/O here: resolution results come in as a mapping, so the rules are testable without DNS.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Sequence

from dlb.config.hostport import is_ip
from dlb.config.model import Config, HostPort, Server


def ip_order(ip: str) -> tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Sort key of an address: IPv4 first, then numerically (stable resources, stable xDS versions)."""
    addr = ipaddress.ip_address(ip)
    return addr.version, addr


def dns_names(cfg: Config) -> dict[str, int]:
    """Every server host that is a DNS name, with a port of it (``getaddrinfo`` wants one)."""
    return {s.address.host: s.address.port for c in cfg.cells for s in c.servers if not is_ip(s.address.host)}


def expand(cfg: Config, resolved: Mapping[str, Sequence[str]]) -> Config:
    """``cfg`` with each server whose host is in ``resolved`` replaced by one server per address.

    Order is stable (addresses sorted) so the rendered resources, and their xDS versions, do not
    change when a resolver returns the same set in another order. An address that already belongs to
    the cell (two names for one pod) is kept once. A name with no addresses yet stays as it is (the
    leaf Envoy then resolves it itself, as a ``STRICT_DNS`` cluster).
    """
    cells = []
    for cell in cfg.cells:
        servers: list[Server] = []
        seen: set[HostPort] = set()
        for s in cell.servers:
            ips = sorted(set(resolved.get(s.address.host, ())), key=ip_order)
            candidates = [dataclasses.replace(s, address=HostPort(ip, s.address.port)) for ip in ips] or [s]
            for c in candidates:
                if c.address not in seen:
                    seen.add(c.address)
                    servers.append(c)
        replicas = max(len(servers), 1) if cell.replicas_auto else cell.replicas
        cells.append(dataclasses.replace(cell, servers=tuple(servers), replicas=replicas))
    return dataclasses.replace(cfg, cells=tuple(cells))
