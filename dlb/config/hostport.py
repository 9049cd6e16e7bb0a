"""Addresses in a config: ``host:port`` parsing and the one test of "is this an IP literal"."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from dlb.config.model import HostPort

HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def is_ip(host: str) -> bool:
    """True for an IPv4 or IPv6 literal; an IPv6 one may be bracketed as in a URL (``[::1]``).

    Why one function: Envoy needs ``STATIC`` clusters and listeners on IPs and DNS for names, and the
    three copies this replaced disagreed (one stripped any bracket, so ``1.2.3.4]`` and ``[10.0.0.1]``
    passed). Brackets are only IPv6's, and only as a pair.
    """
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        return ":" in inner and _ip(inner)
    return "[" not in host and "]" not in host and _ip(host)


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def parse_hostport(v: Any) -> HostPort | None:
    """``host:port`` → HostPort, or None. IPv6 needs brackets; ports 1..65535; hosts are IPs or DNS names."""
    if not isinstance(v, str):
        return None
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]\s]+):(\d{1,5})", v)
    if not m:
        return None
    host, port_s = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    port = int(port_s)
    if not 1 <= port <= 65535 or (m.group(1) and not is_ip(f"[{host}]")):  # brackets hold an IPv6 address only
        return None
    # Not an IP: a DNS name, whose last label is never all digits (so 999.1.1.1 is a typo, not a name).
    if not _ip(host) and (m.group(1) or not HOSTNAME_RE.match(host) or host.rsplit(".", 1)[-1].isdigit()):
        return None
    return HostPort(host, port)

