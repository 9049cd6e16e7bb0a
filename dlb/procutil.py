"""Child-process helpers shared by the Envoy, service and emulator launchers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
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


def log_tail(path: str | os.PathLike[str], n: int = 40) -> str:
    """The last ``n`` lines of a log file ("" if it cannot be read): for error messages."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for configs that need an address before the service runs).

    Never the same port twice in one process: the kernel readily hands a just-released port out
    again, so two calls in a row could otherwise name one address for two services (seen in CI).
    """
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind((host, 0))
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
    for _ in range(200):
        base = free_port(host)
        if base + n - 1 > 65535:
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
