"""Server discovery, the I/O part: resolve the config's server names to every A/AAAA record.

:func:`resolve_all` asks the system resolver (``getaddrinfo``, so ``/etc/hosts`` and the cluster's
DNS alike); the control plane calls it every ``discovery.dns_period_s`` through a
:data:`Resolver`, which tests replace with a stub. A name that fails to resolve keeps its last
addresses: a DNS hiccup must not empty a cell.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily

from dlb.config.discovery import ip_order
from dlb.log import get_logger
from dlb.probe.replica_dns import resolve_all  # noqa: F401 - the one resolver; re-exported for the control plane

log = get_logger("dlb.control_plane.dns")

#: ``(host, port) -> addresses``: every IP the name has now (raises OSError when it has none).
Resolver = Callable[[str, int], Awaitable[list[str]]]

#: Most addresses one name may add to a cell: a bound on the endpoints (and the EDS message) a
#: runaway Service could create. Past it the lowest addresses are kept and the cut is counted.
MAX_ADDRESSES_PER_NAME = 1024


@dataclass
class DnsStats:
    """Counters behind ``dlb_xds_dns_*`` (docs/metrics.md)."""

    resolutions: int = 0
    failures: int = 0
    truncated: int = 0


async def resolve_names(names: Mapping[str, int], resolver: Resolver, last: Mapping[str, tuple[str, ...]],
                        stats: DnsStats | None = None) -> dict[str, tuple[str, ...]]:
    """Resolve every name; one that fails or comes back empty keeps its ``last`` addresses."""
    stats = stats if stats is not None else DnsStats()
    out: dict[str, tuple[str, ...]] = {}
    for host, port in names.items():
        stats.resolutions += 1
        try:
            ips = tuple(sorted(set(await resolver(host, port)), key=ip_order))
        except (OSError, UnicodeError, ValueError) as e:
            stats.failures += 1
            log.warning("dns_resolve_failed", host=host, error=str(e), kept=list(last.get(host, ())))
            ips = ()
        if len(ips) > MAX_ADDRESSES_PER_NAME:
            stats.truncated += 1
            log.warning("dns_addresses_truncated", host=host, addresses=len(ips), kept=MAX_ADDRESSES_PER_NAME)
            ips = ips[:MAX_ADDRESSES_PER_NAME]
        if not ips:
            ips = tuple(last.get(host, ()))
        if ips:
            out[host] = ips
    return out


def dns_families(stats: DnsStats) -> Iterator[CounterMetricFamily]:
    """The control plane's discovery counters, for its status server's ``/metrics``."""
    yield CounterMetricFamily("dlb_xds_dns_resolutions", "server-name resolutions attempted", value=stats.resolutions)
    yield CounterMetricFamily("dlb_xds_dns_failures", "server-name resolutions that failed (last addresses kept)",
                              value=stats.failures)
    yield CounterMetricFamily("dlb_xds_dns_truncated", f"resolutions cut to {MAX_ADDRESSES_PER_NAME} addresses",
                              value=stats.truncated)
