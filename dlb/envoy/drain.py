"""``dlb envoy drain``: let a pod's Envoy finish its requests before it is stopped (Kubernetes ``preStop``).

Why: Envoy exits on SIGTERM at once, cutting every request in flight (a generation can run for
minutes). Envoy Gateway and Contour ship a shutdown manager for the same reason. The drain, in order:

1. ``POST /healthcheck/fail``: the ``dlb_ready`` listener answers 503, so the pod leaves its Service
   and load balancers stop sending new connections;
2. ``POST /drain_listeners?graceful``: Envoy's drain sequence (HTTP/1 ``connection: close``, HTTP/2
   GOAWAY) for ``--drain-time-s``; requests in flight go on;
3. wait until the sum of ``http.<listener>.downstream_rq_active`` (admin's own excluded: this poll
   is one of them) is 0, or the deadline passes. Then the kubelet's SIGTERM finds nothing to cut.

:func:`active_requests` is the pure part (stats text in, count out); :func:`drain` does the I/O; the
command is :func:`dlb.envoy.cli.register_drain`.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

#: A downstream HTTP request gauge of a listener's connection manager (``http.<stat_prefix>.downstream_rq_active``).
_ACTIVE = re.compile(r"^http\.(?P<prefix>.+)\.downstream_rq_active: (?P<value>\d+)$", re.MULTILINE)


def active_requests(stats_text: str) -> int:
    """Requests in flight on every HTTP listener, from admin ``/stats`` text; admin's own are not counted."""
    return sum(int(m["value"]) for m in _ACTIVE.finditer(stats_text) if m["prefix"] != "admin")


@dataclass(frozen=True)
class DrainResult:
    drained: bool  # nothing in flight when the wait ended (False: the deadline passed first)
    active_at_start: int
    active_at_end: int
    waited_s: float


def drain(admin_port: int, deadline_s: float, *, poll_s: float = 0.1, host: str = "127.0.0.1",
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> DrainResult:
    """Fail health checks, start a graceful listener drain, then wait for in-flight requests (see module doc)."""
    base = f"http://{host}:{admin_port}"

    def call(path: str, method: str) -> str:
        req = urllib.request.Request(base + path, method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.read().decode()

    start = clock()
    call("/healthcheck/fail", "POST")
    call("/drain_listeners?graceful", "POST")
    first = active = active_requests(call("/stats?filter=downstream_rq_active", "GET"))
    while active > 0 and clock() - start < deadline_s:
        sleep(min(poll_s, max(0.0, deadline_s - (clock() - start))))
        active = active_requests(call("/stats?filter=downstream_rq_active", "GET"))
    return DrainResult(drained=active == 0, active_at_start=first, active_at_end=active, waited_s=clock() - start)
