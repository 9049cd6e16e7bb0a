"""A small process supervisor: start children in tiers, wait for readiness, restart, stop in order.

Why not the launchers the tests use (:mod:`dlb.testbed.process`, :class:`dlb.envoy.binary.EnvoyProcess`):
those stop their children from ``__del__``/context managers, which never run when the parent is
SIGKILLed, and they start children in their own sessions (so nothing else kills them either). The
issue that motivated ``dlb up`` saw exactly that: Python services outliving their launcher. Here:

- every child gets ``PR_SET_PDEATHSIG = SIGKILL`` (Linux) in the forked child before ``exec``, so the
  kernel kills it when the supervisor dies, however it dies; a child that finds its parent already
  gone right after arming it exits at once (the race between ``fork`` and ``prctl``);
- every child runs in its own session, so Ctrl-C in the terminal reaches only the supervisor, which
  then stops the tiers in the reverse of the start order (roots, leaves, control plane, servers),
  SIGTERM first and SIGKILL for whatever is still alive at the shared deadline;
- a child that exits while the supervisor runs is restarted with exponential backoff (0.5 s doubling
  to 10 s, reset after 30 s of uptime), and the console says so.

Console output is one line per state change (starting, ready, exited, restarting, stopped), and
every 5 s one line per child not ready yet saying what it waits for (its ``waiting`` description);
the children's output goes to one log file each in the run directory. Pure bookkeeping lives in
:class:`Child`; all waiting is polling with short sleeps (no threads: PDEATHSIG follows the thread
that forked, so everything is forked from the main thread).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from dlb.procutil import log_tail

_PR_SET_PDEATHSIG = 1
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 30.0
#: Seconds :meth:`Supervisor.stop` may take in all; each tier gets an equal share of what is left, so
#: a service must exit within ``STOP_BUDGET_S / tiers`` of SIGTERM (2.25 s under ``dlb demo``'s four).
STOP_BUDGET_S = 9.0
#: While a child is not ready, say what it waits for this often (first after this long): a root
#: that waits for a dead cell used to leave the console silent until the ready timeout.
WAIT_REPORT_S = 5.0
#: Set in every child's environment to the run directory: lets a test (or an operator) find every
#: process of a run in /proc, including ones whose command line does not name the run.
RUN_ENV = "DLB_SUPERVISED_RUN"


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux/glibc
    _LIBC = None


def _arm_parent_death_signal(parent: int) -> None:  # pragma: no cover - runs in the forked child
    """preexec_fn: die with the parent. ``os.getppid()`` after arming closes the fork/prctl race."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


@dataclass
class Child:
    """One supervised process: how to start it, how to tell it is ready, and its run state."""

    name: str
    tier: str
    argv: list[str]
    log_path: Path
    #: Returns True once the child serves (called repeatedly while it starts). None: ready when spawned.
    ready: Callable[[], bool] | None = None
    #: While not ready: what the child still waits for, in words ("" if it cannot tell).
    waiting: Callable[[], str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: Called before every (re)start, e.g. to remove a stale ready file.
    before_start: Callable[[], None] | None = None
    proc: subprocess.Popen[bytes] | None = None
    state: str = "new"  # new, starting, ready, backoff, stopped
    restarts: int = 0
    started_at: float = 0.0
    backoff_s: float = BACKOFF_START_S
    restart_at: float = 0.0
    exit_code: int | None = None
    waiting_said_at: float = 0.0
    last_waiting: str = ""
    #: Size of the log when this run of the child started: what it wrote since is its own.
    log_start: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class StartError(RuntimeError):
    """A child did not become ready in time or exited during start-up; the message names it and its log."""


class Supervisor:
    """Children in tiers; ``start()`` brings tiers up in order, ``poll()`` restarts, ``stop()`` tears down."""

    def __init__(self, run_dir: Path, console: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 wait_report_s: float = WAIT_REPORT_S) -> None:
        self.run_dir = run_dir
        self.wait_report_s = wait_report_s
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self.tiers: list[str] = []
        self.console = console if console is not None else sys.stdout
        self.clock = clock
        self.t0 = clock()
        self.quiet = False
        self.events: list[tuple[float, str, str]] = []  # (t, child, event) for reports and tests

    def say(self, child: str, event: str) -> None:
        t = self.clock() - self.t0
        self.events.append((t, child, event))
        if not self.quiet:
            print(f"[{t:6.1f}s] {child}: {event}", file=self.console, flush=True)

    def add(self, child: Child) -> Child:
        if child.tier not in self.tiers:
            self.tiers.append(child.tier)
        self.children.append(child)
        return child

    def _spawn(self, c: Child) -> None:
        if c.before_start is not None:
            c.before_start()
        env = dict(os.environ, **c.env, **{RUN_ENV: str(self.run_dir.resolve())})
        with open(c.log_path, "ab") as log:
            c.log_start = log.tell()
            c.proc = subprocess.Popen(c.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                      start_new_session=True, preexec_fn=functools.partial(_arm_parent_death_signal, os.getpid()))  # noqa: PLW1509 - prctl + getppid only: no locks taken in the child
        c.started_at = c.waiting_said_at = self.clock()
        c.last_waiting = ""
        c.state = "starting"
        c.exit_code = None

    def _say_waiting(self, c: Child) -> None:
        """Every ``wait_report_s`` while ``c`` is not ready: what it waits for (or how long it has waited)."""
        now = self.clock()
        if now - c.waiting_said_at < self.wait_report_s:
            return
        c.waiting_said_at = now
        c.last_waiting = _describe(c)
        self.say(c.name, f"not ready after {now - c.started_at:.0f}s: waiting for {c.last_waiting}" if c.last_waiting
                 else f"not ready after {now - c.started_at:.0f}s")

    def start(self, timeout_s: float = 90.0, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Start every tier in order; a tier's children start together and must all be ready before the next."""
        for tier in self.tiers:
            group = [c for c in self.children if c.tier == tier]
            for c in group:
                self._spawn(c)
                self.say(c.name, f"starting (pid {c.pid})")
            deadline = self.clock() + timeout_s
            while True:
                if should_stop():
                    raise KeyboardInterrupt
                pending = False
                for c in group:
                    if c.state != "starting":
                        continue
                    assert c.proc is not None
                    if c.proc.poll() is not None:
                        raise StartError(f"{c.name} exited with {c.proc.returncode} while starting; log {c.log_path}:\n"
                                         f"{log_tail(c.log_path, 20)}")
                    if c.ready is None or _safe(c.ready):
                        c.state = "ready"
                        self.say(c.name, f"ready (pid {c.pid}, {self.clock() - c.started_at:.1f}s)")
                    else:
                        pending = True
                        self._say_waiting(c)
                if not pending:
                    break
                if self.clock() > deadline:
                    late = [c for c in group if c.state == "starting"]
                    for c in late:  # the reason as of now, not as of the last report
                        c.last_waiting = _describe(c)
                    names = ", ".join(f"{c.name} (waiting for {c.last_waiting})" if c.last_waiting else c.name for c in late)
                    raise StartError(f"not ready after {timeout_s:.0f}s: {names}; logs in {self.run_dir}")
                time.sleep(0.05)

    def poll(self) -> None:
        """Notice exited children, restart them after their backoff, mark restarted ones ready."""
        now = self.clock()
        for c in self.children:
            if c.proc is None or c.state == "stopped":
                continue
            if c.state == "backoff":
                if now >= c.restart_at:
                    c.restarts += 1
                    self._spawn(c)
                    self.say(c.name, f"restarted (pid {c.pid}, restart {c.restarts})")
                continue
            code = c.proc.poll()
            if code is not None:
                c.exit_code = code
                if now - c.started_at > STABLE_AFTER_S:
                    c.backoff_s = BACKOFF_START_S
                c.restart_at = now + c.backoff_s
                # An error exit says why on the console: a restart loop on a config broken since start-up
                # printed only "exited with 1" while the reason sat in the log.
                why = _last_line(c.log_path, c.log_start) if code > 0 else ""
                self.say(c.name, f"exited with {code}{f' ({why})' if why else ''}; restarting in {c.backoff_s:.1f}s "
                         f"(log {c.log_path.name})")
                c.backoff_s = min(c.backoff_s * 2, BACKOFF_MAX_S)
                c.state = "backoff"
                continue
            if c.state == "starting":
                if c.ready is None or _safe(c.ready):
                    c.state = "ready"
                    self.say(c.name, "ready")
                else:
                    self._say_waiting(c)

    def stop(self, budget_s: float = STOP_BUDGET_S) -> None:
        """Stop tiers in reverse start order: SIGTERM a tier, wait for it (a share of the budget), then the next.

        Whatever is alive at the end of the budget is SIGKILLed, so the whole stop takes at most ``budget_s``.
        """
        deadline = self.clock() + budget_s
        tiers = list(reversed(self.tiers))
        for k, tier in enumerate(tiers):
            group = [c for c in self.children if c.tier == tier and c.proc is not None]
            for c in group:
                c.state = "stopped"
                if c.proc is not None and c.proc.poll() is None:
                    try:
                        c.proc.send_signal(signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            # Each tier may use its share of what is left, so a hung tier cannot eat the later ones' time.
            tier_deadline = self.clock() + (deadline - self.clock()) / (len(tiers) - k)
            while any(c.proc is not None and c.proc.poll() is None for c in group) and self.clock() < tier_deadline:
                time.sleep(0.02)
            for c in group:
                assert c.proc is not None
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.proc.wait(2)
                    self.say(c.name, "killed (did not stop on SIGTERM in time)")
                else:
                    self.say(c.name, f"stopped ({c.proc.returncode})")

    def signal_ready(self, tier: str, sig: int) -> int:
        """Send ``sig`` to the ready children of ``tier``; returns how many (``dlb up`` passes SIGHUP on to
        its control planes: one still starting may not handle it yet, and would die of it)."""
        group = [c for c in self.children if c.tier == tier and c.state == "ready" and c.proc is not None and c.proc.poll() is None]
        for c in group:
            c.proc.send_signal(sig)  # type: ignore[union-attr]
        return len(group)

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children if c.proc is not None]


def processes_of_run(run_dir: Path) -> list[int]:
    """Live pids whose environment carries ``RUN_ENV=run_dir`` (children of a supervisor, and theirs)."""
    marker = f"{RUN_ENV}={run_dir.resolve()}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in env.split(b"\0") and stat.rpartition(")")[2].split()[0] != "Z":
            out.append(int(entry.name))
    return out


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:
        return False


def _describe(c: Child) -> str:
    """What ``c`` waits for, in words ("" when it has no description)."""
    if c.waiting is None:
        return ""
    try:
        return str(c.waiting())
    except Exception as e:  # a description must never stop the supervisor
        return f"? ({type(e).__name__}: {e})"


def _last_line(path: Path, start: int, limit: int = 200) -> str:
    """The last non-blank line ``path`` got after byte ``start``, cut to ``limit`` characters ("" if none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(start, fh.seek(0, os.SEEK_END) - 4096))  # the end is enough, however long it ran
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""
