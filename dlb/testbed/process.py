"""Run ``dlb serve root`` / ``dlb serve leaf`` as child processes (tests, benchmarks, demos).

The child writes a ready file (JSON with its bound ports) once it serves, so callers never poll a
port or guess when start-up is over. Output goes to a log file kept for failure messages. ``stop``
sends SIGTERM (graceful), then SIGKILL; the context manager always stops the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlb.procutil import free_port, log_tail, stop_process

__all__ = ["ServiceProcess", "free_port"]


class ServiceProcess:
    """``with ServiceProcess("leaf", "--config", path, "--cell", "a") as p: p.ready["grpc"]``."""

    def __init__(self, command: str, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 60.0) -> None:
        self.command = command
        self.args = list(args)
        self.env = env
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self._dir = tempfile.TemporaryDirectory(prefix=f"dlb-{command}-")
        self.log_path = Path(self._dir.name) / "service.log"

    def start(self) -> ServiceProcess:
        self.spawn()
        self.wait_ready()
        return self

    @property
    def _ready_file(self) -> Path:
        return Path(self._dir.name) / "ready.json"

    def spawn(self) -> None:
        """Start the child without waiting (start several, then ``wait_ready`` each: imports overlap)."""
        self._ready_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "dlb.cli", "serve", self.command, *self.args, "--ready-file", str(self._ready_file)]
        env = dict(os.environ, **(self.env or {}))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self) -> None:
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dlb serve {self.command} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._ready_file.exists():
                self.ready = json.loads(self._ready_file.read_text())
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"dlb serve {self.command} not ready after {self.ready_timeout}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)

    def __enter__(self) -> ServiceProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # last resort: never leave an orphan behind
        try:
            self.stop(1.0)
        except Exception:
            pass
