"""Child-process helpers shared by the Envoy, service and emulator launchers."""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> int | None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code. Idempotent."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


def log_tail(path: str | os.PathLike[str], n: int = 40, max_bytes: int = 1 << 18) -> str:
    """The last ``n`` lines of a log file within its last ``max_bytes`` ("" if it cannot be read): for error
    messages, and for readers that poll a long-running service's log (only its end is read)."""
    try:
        with open(path, "rb") as fh:
            start = max(0, fh.seek(0, os.SEEK_END) - max_bytes)
            fh.seek(start)
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join((lines[1:] if start else lines)[-n:])  # a read from mid-file starts on a cut line


#: The control plane's default xDS and status ports (``dlb.config.model``): a config whose cell was given one
#: of them by :func:`free_port` is refused as a clash with a default it never set (a CI run drew 18001).
DEFAULT_SERVICE_PORTS = frozenset({18000, 18001})
_handed_out: set[int] = set(DEFAULT_SERVICE_PORTS)  # never handed out
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
#: Lowest port :func:`free_port` hands out: above the well-known and most registered service ports.
LOWEST_PORT = 10000
#: One past the highest: Kubernetes' NodePort range starts at 30000, and on a node kube-proxy redirects
#: those ports on every local address, loopback included.
HIGHEST_PORT = 30000
#: Fewest ports below the ephemeral range worth drawing from; fewer, and two concurrent test runs
#: would pick the same port too often, so the old way (the kernel's pick of port 0) is used instead.
MIN_POOL = 2000
_random = random.SystemRandom()  # not the global generator: tests seed it, and two seeded runs would collide
#: ``i/n``: hand out only ports ≡ i (mod n). Processes that draw from one pool at once (pytest-xdist
#: workers, and every service they start, which inherit it) then never draw the same port: a port one drew
#: and had not bound yet was taken by another's draw (a control plane's status port, fresh-clone CI).
PORT_STRIPE_ENV = "DLB_PORT_STRIPE"


def _stripe() -> tuple[int, int]:
    """(i, n) from :data:`PORT_STRIPE_ENV`; (0, 1) when unset or malformed."""
    try:
        i, n = (int(v) for v in os.environ.get(PORT_STRIPE_ENV, "0/1").split("/"))
    except ValueError:
        return 0, 1
    return (i, n) if 0 <= i < n else (0, 1)


def ephemeral_range(path: str = _EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range of ephemeral ports (``connect()``'s source ports, ``bind(port 0)``), or None."""
    try:
        lo, hi = (int(v) for v in Path(path).read_text().split())
    except (OSError, ValueError):
        return None
    return lo, hi


def reserve_ports(ports: Iterable[int]) -> None:
    """Never hand these ports out: they are named elsewhere (a config another process will bind) but not bound yet."""
    _handed_out.update(ports)


def _pool_top(ephemeral: tuple[int, int] | None = None) -> int | None:
    """One past the highest port :func:`free_port` draws from, or None to let the kernel pick."""
    span = ephemeral or ephemeral_range()
    if span is None:
        return None
    top = min(span[0], HIGHEST_PORT)
    return top if top - LOWEST_PORT >= MIN_POOL else None


def free_port(host: str = "127.0.0.1", ephemeral: tuple[int, int] | None = None) -> int:
    """A port that was free a moment ago (for configs that need an address before the service runs).

    Why not the kernel's pick of port 0: that port comes from the ephemeral range, the range every
    other ``bind(port 0)`` on the machine draws from (each test server, emulator or gRPC service that
    binds port 0, in this run and in the runs next to it) and outgoing connections take their source
    ports from. Between this call and the bind by the service that was given the port (an Envoy
    seconds later) another socket could take it, and the Envoy then NACKed its listener and never
    became ready — the free-port races of the CI runs (test_faults_e2e, test_up). Measured: after 300
    ports were handed out, 2000 sockets bound to port 0 and 1000 client connections took 50 of them
    from the kernel's pick, 0 of these (Linux gives connections mostly even ports and ``bind(0)``
    odd ones, so the thief is mostly another ``bind(0)``). So the port is drawn at random from
    [``LOWEST_PORT``, start of the ephemeral range or ``HIGHEST_PORT``): the kernel never hands those out by itself,
    only an explicit bind to that number takes one. ``ephemeral`` overrides the range read from
    /proc (for tests); when it cannot be read or leaves fewer than ``MIN_POOL`` ports below it,
    the kernel's pick is used, as before.

    Never the same port twice in one process: a port just handed out is not bound yet, so two calls
    in a row could otherwise name one address for two services (seen in CI).
    """
    top = _pool_top(ephemeral)
    i, n = _stripe()
    # Ports q·n + i in [LOWEST_PORT, top): q from ⌈(LOWEST_PORT − i)/n⌉ up to, not including, ⌈(top − i)/n⌉.
    q_range = (-(-(LOWEST_PORT - i) // n), -(-(top - i) // n)) if top else (0, 0)
    for _ in range(1000):
        with socket.socket() as sock:
            try:
                sock.bind((host, _random.randrange(*q_range) * n + i if top else 0))
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue  # in use (or in TIME_WAIT), or reserved: draw another
                raise
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no fresh free port after 1000 tries")


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """The first of ``n`` consecutive ports that were all free a moment ago (a data-parallel server's
    ranks listen on port .. port + n - 1, as vLLM's external DP load balancing deploys them)."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    top = _pool_top() or 65536
    for _ in range(200):
        base = free_port(host)
        if base + n > top:
            continue
        socks = []
        try:
            for k in range(1, n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, base + k))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        if not any(base + k in _handed_out for k in range(1, n)):
            _handed_out.update(base + k for k in range(1, n))
            return base
    raise RuntimeError(f"no block of {n} free ports after 200 tries")
