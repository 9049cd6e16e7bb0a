"""deploy/docker/Dockerfile: hadolint always; a real offline build and run when podman can run here.

Here: the tests that start dlb services, open sockets or run subprocesses; the others: ``tests/e2e/test_image.py``.

The build test (marker ``container``) needs root, ``podman``, ``runc`` and ``debootstrap`` (Debian
packages; ``.ci/run`` installs them when it runs as root with apt). Otherwise it is skipped, saying
which is missing. What it does, as an operator with no registry would:

1. a base image from ``debootstrap --variant=minbase --include=python3,python3-venv bookworm``,
   imported into podman as ``localhost/dlb-test-base:bookworm`` and kept for later runs (remove it
   with ``podman rmi localhost/dlb-test-base:bookworm``): the real ``python:3.11-slim-bookworm``
   needs a registry;
2. the wheelhouse: ``pip wheel . -w DIR`` (from pip's cache or the package index);
3. ``podman build --isolation=chroot`` inside an empty network namespace (``unshare --net``): a
   build that reached for the network would fail here;
4. ``dlb --help``, ``envoy --version`` and ``id -u`` in the image, with no network, as UID 65532;
5. with ``ip netns`` too: ``dlb serve emulator`` from the image in one namespace of a
   :class:`~dlb.testbed.netns.Lab` (``podman run --network ns:``) answers a request from another.
   ``--runtime runc --cgroup-manager=cgroupfs`` and explicit rlimits: crun, and rlimits above the
   hard limit, fail on hosts with hybrid cgroups or without CAP_SYS_RESOURCE.

The image size is printed and recorded as a test property (``-rA`` or the JUnit XML shows it).
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
