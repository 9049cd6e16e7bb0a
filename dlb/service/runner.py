"""Process plumbing shared by the services: the event-loop runner, ready files and worker processes.

Why a module of its own: the root, the leaf and the benchmark's constant-reply server all start the same
way (uvloop, optional cProfile, a ready file written atomically once serving, optional ``SO_REUSEPORT``
workers that die with their parent), and none of that belongs next to a request path.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from dlb.errors import StartupError

PARENT_PID_ENV = "DLB_PARENT_PID"


def die_with_parent() -> None:
    """In a worker started by :func:`spawn_workers`: get SIGTERM when the first process dies (Linux
    PR_SET_PDEATHSIG), and exit now if it already has (the signal is only armed from here on)."""
    import ctypes
    import signal

    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):  # reparented: the first process died before the signal was armed
        raise StartupError("dlb serve root: the first process exited before this worker started")


def spawn_workers(workers: int, listen: str, metrics: str | None) -> list:
    """Start workers 1..n-1 with this process's arguments on the bound port; they die with us."""
    import subprocess
    import sys
    import tempfile

    base = _strip_args(sys.argv[1:], {"--listen", "--metrics", "--ready-file", "--worker-index"})
    out = []
    for k in range(1, workers):
        fd, ready = tempfile.mkstemp(prefix="dlb-root-worker-", suffix=".json")  # a unique name the worker creates
        os.close(fd)
        os.unlink(ready)
        args = [*base, "--listen", listen, "--worker-index", str(k), "--ready-file", ready]
        if metrics:
            host, _, mport = metrics.rpartition(":")
            args += ["--metrics", f"{host}:{int(mport) + 100 * k}" if int(mport) else metrics]
        else:
            args += ["--metrics", ""]
        # No preexec_fn: it forces a plain fork() while this process's gRPC threads run, and gRPC's fork
        # handlers then abort the child before exec (seen as "worker exited with -6" under load). The
        # worker ties its life to ours itself (die_with_parent, from DLB_PARENT_PID).
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        out.append((subprocess.Popen([sys.executable, "-m", "dlb.cli", *args], env=env), ready))
    return out


def _strip_args(argv: list[str], drop: set[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        if a.split("=", 1)[0] in drop:
            continue
        out.append(a)
    return out


def wait_worker(child: tuple, timeout: float = 60.0) -> int:
    proc, ready = child
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartupError(f"dlb serve root: worker exited with {proc.returncode}")
        if os.path.exists(ready):
            os.unlink(ready)
            return proc.pid
        time.sleep(0.05)
    raise StartupError("dlb serve root: a worker did not become ready")


def write_ready(path: str, data: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: a watcher never reads half a file


def run_event_loop(coro) -> None:
    """Run with uvloop (measured faster for grpc.aio here) when available.

    ``DLB_PROFILE=FILE`` runs the service under cProfile and writes the stats to FILE.<pid> at exit: the
    way the hot path was profiled (docs/data-plane.md).
    """
    prof_path = os.environ.get("DLB_PROFILE")
    if prof_path:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            _run(coro)
        finally:
            prof.disable()
            prof.dump_stats(f"{prof_path}.{os.getpid()}")  # one file per service process
        return
    _run(coro)


def _run(coro) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a runtime dependency
        asyncio.run(coro)
        return
    uvloop.run(coro)
