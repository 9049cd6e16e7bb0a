"""xDS-pushed Envoys carry the same connection cap as static ones (issue 14 row 10).

The overload manager exists only in the bootstrap (xDS cannot push it), so an Envoy started from
``dlb config xds-bootstrap`` without it accepts connections until file descriptors run out and warns at start.
"""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from bounded_wait import until

from dlb.cli import main
from dlb.envoy.binary import envoy_binary, validate
from dlb.envoy.bootstrap import MAX_DOWNSTREAM_CONNECTIONS
from dlb.procutil import free_port, stop_process

NO_LIMIT = "no configured limit to the number of allowed active downstream connections"


def _start_log(bootstrap: Path, admin_port: int, log: Path) -> str:
    """Start Envoy, wait until its admin answers (no control plane: it never gets ready), return its log."""
    proc = subprocess.Popen([envoy_binary(), "-c", str(bootstrap), "--log-level", "warning", "--log-path", str(log),
                             "--disable-hot-restart", "--concurrency", "1", "--base-id", str(admin_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def admin_answers() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/server_info", timeout=1).read()
            except OSError:
                return False
            return True

        until(admin_answers, "Envoy's admin answering", timeout=120)
    finally:
        stop_process(proc, 10)
    return log.read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["root", "leaf"])
def test_xds_bootstrap_caps_connections_validates_and_starts_without_warning(tmp_path: Path, role: str) -> None:
    out, admin = tmp_path / "boot.yaml", free_port()
    token = tmp_path / "root-token"  # a root's bootstrap names the token file (it never travels in xDS)
    token.write_text("t" * 32)
    extra = ["--root-token-file", str(token)] if role == "root" else []
    assert main(["config", "xds-bootstrap", "--role", role, "--cell", "a", "--xds", f"127.0.0.1:{free_port()}",
                 "--admin-port", str(admin), "-o", str(out), *extra]) == 0
    boot = yaml.safe_load(out.read_text())
    monitors = boot["overload_manager"]["resource_monitors"]
    assert [m["typed_config"]["max_active_downstream_connections"] for m in monitors] == [MAX_DOWNSTREAM_CONNECTIONS]
    checked = validate(out)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    log = _start_log(out, admin, tmp_path / "envoy.log")
    warnings = [line for line in log.splitlines() if "[warning]" in line and "ENVOY_SIGTERM" not in line]
    assert NO_LIMIT not in log and not warnings, log
