"""The unit tier's guard: any attempt to open a socket or start a process fails the test.

Why: ``tests/unit`` is the fast tier (in-process, no sockets, no subprocesses, no Envoy); a test that
quietly starts a service there makes the tier slow and flaky on a busy box, so the guard turns the
first such attempt into a failure naming the tier it belongs in. ``tests/unit/conftest.py`` installs it
around every phase (setup, call, teardown) of each unit test. Guards nest: only the innermost one
records, so a unit test can check the guard itself.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

MOVE = "move it to tests/integration"
PORT_PICKERS = frozenset({"free_port", "free_port_block"})
_INHERITED_BIND = socket.socket.bind


class TierViolation(RuntimeError):
    """Raised where a unit test tried to open a socket or start a process."""


@dataclass
class Guard:
    """What one guarded stretch of a unit test attempted (each entry one forbidden call)."""

    violations: list[str] = field(default_factory=list)

    def trip(self, kind: str, what: str) -> NoReturn:
        msg = f"unit tests may not {kind} ({what}); {MOVE}"
        self.violations.append(msg)
        raise TierViolation(msg)


_active: list[Guard] = []
_saved: list[tuple[object, str, object]] = []
_INHERITED = object()  # the attribute came from a base class (``socket.socket.connect``): delete, not set


def _trip(kind: str, what: str) -> NoReturn:
    _active[-1].trip(kind, what)


def _picks_a_port_number() -> bool:
    """Whether the bind comes from dlb's ``free_port``/``free_port_block``: a port number for a config.

    They bind and close at once (no traffic, no listener): a unit test may build a config that names a
    free port; the service that would bind it is what the guard stops.
    """
    caller = sys._getframe(2)
    return caller.f_code.co_name in PORT_PICKERS and str(caller.f_globals.get("__name__", "")).startswith("dlb.")


def _socket_call(name: str) -> Callable[..., Any]:
    def guarded(self: socket.socket, address: Any, *a: object, **kw: object) -> Any:
        if name == "bind" and _picks_a_port_number():
            return _INHERITED_BIND(self, address)
        _trip("open sockets", f"socket.{name}({address!r})")

    return guarded


def _process_call(name: str) -> Callable[..., Any]:
    def guarded(*args: object, **kw: object) -> Any:
        shown = args[1] if name == "subprocess.Popen" and len(args) > 1 else args[:1]
        _trip("start processes", f"{name}: {shown!r}")

    return guarded


def _async_call(kind: str, name: str) -> Callable[..., Any]:
    async def guarded(*args: object, **kw: object) -> Any:
        _trip(kind, f"asyncio {name}")

    return guarded


def _grpc_call(name: str) -> Callable[..., Any]:
    def guarded(*args: object, **kw: object) -> Any:
        _trip("open sockets", f"{name}{args[:1]!r}")

    return guarded


def _targets() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) for every call that opens a socket or starts a process."""
    out: list[tuple[object, str, object]] = [
        (socket.socket, name, _socket_call(name)) for name in ("connect", "connect_ex", "bind")
    ]
    out.append((subprocess.Popen, "_execute_child", _process_call("subprocess.Popen")))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp",
                 "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"):
        if hasattr(os, name):
            out.append((os, name, _process_call(f"os.{name}")))
    out.append((multiprocessing.process.BaseProcess, "start", _process_call("multiprocessing start")))
    loop_cls = asyncio.base_events.BaseEventLoop
    for name, kind in (("create_server", "start servers"), ("create_connection", "open sockets"),
                       ("subprocess_exec", "start processes"), ("subprocess_shell", "start processes")):
        out.append((loop_cls, name, _async_call(kind, name)))
    try:
        import grpc
        import grpc.aio
    except ImportError:  # pragma: no cover - grpc is a dependency of dlb
        return out
    for mod, prefix in ((grpc, "grpc."), (grpc.aio, "grpc.aio.")):
        for name in ("server", "insecure_channel", "secure_channel"):
            out.append((mod, name, _grpc_call(prefix + name)))
    return out


@contextmanager
def guarding() -> Iterator[Guard]:
    """Forbid sockets and processes inside the block; yield the guard that records attempts."""
    guard = Guard()
    if not _active:
        for owner, name, repl in _targets():
            _saved.append((owner, name, vars(owner).get(name, _INHERITED)))
            setattr(owner, name, repl)
    _active.append(guard)
    try:
        yield guard
    finally:
        _active.pop()
        if not _active:
            while _saved:
                owner, name, orig = _saved.pop()
                if orig is _INHERITED:
                    delattr(owner, name)
                else:
                    setattr(owner, name, orig)
