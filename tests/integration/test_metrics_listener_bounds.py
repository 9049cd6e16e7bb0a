"""A service's /metrics listener is bounded (a stranger held 250 idle connections, one thread each, and dripped
a header a byte per 5 s without being timed out): connections past the cap are closed at accept and counted,
and a client that stops sending is dropped."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from dlb.service import metrics


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _closed(s: socket.socket, within_s: float) -> bool:
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_the_metrics_listener_caps_connections_and_drops_slow_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "HTTP_MAX_CONNECTIONS", 4)
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 1.0)
    before = metrics.HTTP_REFUSED[0]
    _, port = metrics.serve_metrics(list, "127.0.0.1", 0, prefix="dlb_test")
    held = [_connect(port) for _ in range(4)]
    for s in held:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # a header begun and never finished
    time.sleep(0.3)
    extra = _connect(port)
    assert _closed(extra, 3.0), "a connection past the cap was kept"
    assert metrics.HTTP_REFUSED[0] > before
    assert all(_closed(s, 5.0) for s in held), "a client that stopped sending was never dropped"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:  # the slots came back
        assert b"dlb_test_metrics_http_refused_total" in r.read()
    for s in [*held, extra]:
        s.close()
