"""Prometheus metrics that cost (almost) nothing on the request path.

``prometheus_client`` metric objects take a lock per update (~1 µs each, several per request). The
services instead bump plain Python ints/lists in their own state and register a *collector* that
turns that state into metric families when Prometheus scrapes. :class:`FastHistogram` is a bucket
array updated with one ``bisect`` and one list increment.

The same HTTP listener answers an orchestrator's probes: ``GET /healthz`` (the process is alive:
this thread answers) and ``GET /readyz`` (200 while the service's own listener serves, 503 before
and while it drains), so a pod needs no second port for them.
"""

from __future__ import annotations

import bisect
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import Collector

from dlb.log import get_logger

log = get_logger("dlb.metrics")

#: Buckets for per-request processing time inside a service (seconds): 10 µs … 100 ms.
PROCESSING_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)


class FastHistogram:
    """Cumulative-at-scrape histogram; ``observe`` is a bisect plus two additions (no lock).

    Updates happen on the event-loop thread only; a scrape from the exporter thread may read a
    value mid-update, which at worst is off by one observation — acceptable for monitoring.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = PROCESSING_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        buckets = []
        acc = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):  # counts has one more: the +Inf bucket
            acc += count
            buckets.append((repr(bound), acc))
        acc += self.counts[-1]
        buckets.append(("+Inf", acc))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.total)


class CallbackCollector(Collector):
    """A collector whose ``collect`` calls a function returning metric families."""

    def __init__(self, fn: Callable[[], Iterable]) -> None:
        self._fn = fn

    def collect(self):
        try:
            yield from self._fn()
        except Exception:  # a bug in a metric must not break the whole scrape
            log.exception("metrics_collect_failed")


@dataclass
class Readiness:
    """What ``/readyz`` answers: the service sets ``ready`` once its listener serves, clears it to drain."""

    ready: bool = False


def health_app(app: Callable[..., Any], ready: Callable[[], bool]) -> Callable[..., Any]:
    """Wrap a WSGI app with ``/healthz`` (always 200) and ``/readyz`` (200 if ``ready()``, else 503)."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            status, body = "200 OK", b"ok\n"
        elif path == "/readyz":
            status, body = ("200 OK", b"ready\n") if ready() else ("503 Service Unavailable", b"not ready\n")
        else:
            return app(environ, start_response)
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return wrapped


#: The HTTP listener's bounds: a stranger held 250 idle connections (one thread each, 11 -> 89 threads) and
#: dripped a header a byte per 5 s, never timed out. A scrape or a probe takes milliseconds.
HTTP_TIMEOUT_S = 10.0  # per socket read or write: idle and slow clients are dropped
HTTP_MAX_CONNECTIONS = 64  # served at once; beyond, a connection is closed at accept
HTTP_BACKLOG = 128


class _QuietHandler(WSGIRequestHandler):
    timeout = HTTP_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes and probes every few seconds would flood stderr


def serve_metrics(collect: Callable[[], Iterable], host: str, port: int,
                  ready: Callable[[], bool] | None = None, prefix: str | None = None) -> tuple[CollectorRegistry, int]:
    """Start the exporter thread on ``host:port`` (port 0 = any); return the registry and bound port.

    ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` (:func:`health_app`; without ``ready``
    the process counts as ready once this listener is up); ``prefix`` names its ``_metrics_http_refused``.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CallbackCollector(collect))
    if prefix is not None:  # the listener's own bound, as the service's family
        registry.register(CallbackCollector(lambda: [http_refused_family(prefix)]))

    slots = threading.BoundedSemaphore(HTTP_MAX_CONNECTIONS)

    class _Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        request_queue_size = HTTP_BACKLOG

        def process_request(self, request: Any, client_address: Any) -> None:
            if not slots.acquire(blocking=False):  # at the cap: close it rather than start one more thread
                HTTP_REFUSED[0] += 1
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                slots.release()

    app = health_app(make_wsgi_app(registry), ready or (lambda: True))
    server = make_server(host, port, app, _Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name=f"metrics-{port}")
    thread.start()
    # Keep references so the thread is not collected; daemon threads end with the process.
    _servers.append((server, thread))
    return registry, int(server.server_address[1])


_servers: list[tuple[object, threading.Thread]] = []
#: Connections this process's metrics listeners closed at accept, at their cap (``http_refused_family``).
HTTP_REFUSED = [0]


def http_refused_family(prefix: str) -> Any:
    """``<prefix>_metrics_http_refused``: connections the /metrics listener closed at its cap."""
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(f"{prefix}_metrics_http_refused", "Connections to the metrics listener closed at its cap",
                               value=HTTP_REFUSED[0])
