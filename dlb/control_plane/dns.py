"""Server discovery, the I/O part: resolve the config's server names to every A/AAAA record.

:func:`resolve_all` asks the system resolver (``getaddrinfo``, so ``/etc/hosts`` and the cluster's
DNS alike); the control plane calls it every ``discovery.dns_period_s`` through a
:data:`Resolver`, which tests replace with a stub. A name that fails to resolve keeps its last
addresses: a DNS hiccup must not empty a cell.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping

from dlb.log import get_logger

log = get_logger("dlb.control_plane.dns")

#: ``(host, port) -> addresses``: every IP the name has now (raises OSError when it has none).
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_all(host: str, port: int) -> list[str]:
    """Every distinct IP of ``host`` (A and AAAA), as ``getaddrinfo`` returns them."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(ipaddress.ip_address(info[4][0])) for info in infos})


async def resolve_names(names: Mapping[str, int], resolver: Resolver, last: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Resolve every name; one that fails or comes back empty keeps its ``last`` addresses."""
    out: dict[str, tuple[str, ...]] = {}
    for host, port in names.items():
        try:
            ips = tuple(sorted(set(await resolver(host, port))))
        except (OSError, UnicodeError) as e:
            log.warning("dns_resolve_failed", host=host, error=str(e), kept=list(last.get(host, ())))
            ips = ()
        if not ips:
            ips = tuple(last.get(host, ()))
        if ips:
            out[host] = ips
    return out
