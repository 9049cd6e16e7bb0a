"""deploy/docker/Dockerfile: hadolint always; a real offline build and run when podman can run here.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/e2e/test_image.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
RUN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", "run", "--rm", "--network=none",
       "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def _hadolint() -> str:
    path = Path(sys.executable).parent / "hadolint"
    return str(path) if path.exists() else (shutil.which("hadolint") or pytest.skip("hadolint not installed (pip install '.[test]')"))


def test_dockerfile_is_hadolint_clean() -> None:
    out = subprocess.run([_hadolint(), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get install python3\n")
    out = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3007" in out.stdout  # "latest" is not a pin
