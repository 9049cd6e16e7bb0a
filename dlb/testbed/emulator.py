"""Run an emulator as a child process on a free port (testbeds, benchmarks, fault tests that kill it).

The child binds port 0 (and its admin API on another free port) and writes the ports it got to files
(``--port-file``, ``--admin-port-file``), so there is no race between picking a free port and binding
it; we then wait until ``/health`` answers. Fault helpers take ``admin_url``. The child's
output goes to a log file kept for debugging (``log_text()``). Stopping sends SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import dlb
from dlb.procutil import stop_process


def _flags(options: dict[str, Any]) -> list[str]:
    """``{"max_batch": 8, "down": True, "model": ["a", "b"]}`` → ``--max-batch 8 --down --model a --model b``."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


class EmulatorProcess:
    """``with EmulatorProcess(server_id="s1", profile="fast-test", max_batch=8) as p: p.url``.

    Keyword options are ``dlb serve emulator`` flags with ``_`` for ``-``.
    """

    def __init__(self, host: str = "127.0.0.1", startup_timeout: float = 30.0, **options: Any) -> None:
        self.options = options
        self.host = host
        self.startup_timeout = startup_timeout
        self.port = 0
        self.admin_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    @property
    def log_path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "emulator.log"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""

    def command(self, port_file: str) -> list[str]:
        opts = {k: v for k, v in self.options.items() if k not in ("host", "port", "port_file", "admin_port", "admin_port_file")}
        return [sys.executable, "-m", "dlb.cli", "serve", "emulator", "--host", self.host, "--port", "0",
                "--port-file", port_file, "--admin-port", "0", "--admin-port-file", port_file + ".admin", *_flags(opts)]  # fmt: skip

    def start(self) -> EmulatorProcess:
        if self.proc is not None and self.proc.poll() is None:
            return self  # already running: ``with EmulatorProcess(...).start()`` used to orphan a second child
        self._dir = tempfile.TemporaryDirectory(prefix="dlb-emulator-")
        port_file = Path(self._dir.name) / "port"
        env = dict(os.environ)
        # Make ``dlb`` importable in the child even when it is not pip-installed (running from a checkout).
        root = str(Path(dlb.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(self.command(str(port_file)), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not port_file.exists():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"emulator exited with {self.proc.returncode}:\n{self.log_text()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"emulator did not bind within {self.startup_timeout}s:\n{self.log_text()}")
                time.sleep(0.02)
            self.port = int(port_file.read_text())
            self.admin_port = int(Path(str(port_file) + ".admin").read_text())  # written before the port file
            while True:  # listening already; wait until the HTTP layer answers (any status: it may start down)
                try:
                    urllib.request.urlopen(self.url + "/health", timeout=2).read()
                    break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(f"emulator on port {self.port} does not answer:\n{self.log_text()}") from None
                    time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL; returns the exit code. Idempotent."""
        return stop_process(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL without a clean shutdown (fault tests: a server that dies mid-request)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
