"""deploy/k8s checked with no cluster: strict schemas for Kubernetes 1.30-1.37, then DLB's own rules.

Here: the tests that run a real Envoy, the demo, network namespaces or the container;
the others: ``tests/integration/test_k8s_manifests.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

#: CPU-ms per request of each container, keyed (workload base name, container), from the overhead
#: benchmark's closed-loop runs: (config in research/bench/overhead.json, component).
from test_k8s_manifests import (
    K8S,
    REPO,
    _name,
    _pod,
    _substitute,
    _workloads,
    bootstraps,
    overlay_dirs,
    packed_config,
    render,
)


def _cluster_overlays() -> list[Path]:
    """Overlays that deploy a control plane, i.e. a whole cluster (they also carry dlb.yaml)."""
    return [o for o in overlay_dirs() if any(d["kind"] == "Deployment" and d["metadata"]["name"] == "dlb-control-plane"
                                            for d in render(o))]


# -- the rules: each returns its problems, one line each naming the object ---------------------------


#: Where loopback is right: Envoy's admin (never exposed), the hop from a pod's Envoy to its own
#: ext_proc service (dlb.yaml and the root service's --listen). Paths as _strings spells them.


# -- tests ------------------------------------------------------------------------------------------


def _dlb(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dlb.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.envoy
def test_packed_config_passes_dlb_config_validate_envoy(tmp_path: Path) -> None:
    checked = 0
    for d in _cluster_overlays():
        text = packed_config(render(d))
        assert text is not None, d
        path = tmp_path / f"{d.name}.yaml"
        # The token Secret a pod mounts, here a file of our own (the validator reads it).
        (tmp_path / "token").write_text("s3cret-root-token-0123456789\n")
        path.write_text(text.replace("/etc/dlb-root-token/token", str(tmp_path / "token")))
        out = _dlb("config", "validate", "--envoy", str(path))
        assert out.returncode == 0, f"{d.relative_to(REPO)}: {out.stdout}{out.stderr}"
        checked += 1
    assert checked >= 3  # cluster-us, cluster-eu, examples/emulated-cell
    # Planted: a typo in the packed config is caught (the validator really reads what is packed).
    bad = tmp_path / "bad.yaml"
    bad.write_text(str(packed_config(render(K8S / "overlays" / "cluster-us"))).replace("stale_after_ms", "stale_afer_ms"))
    out = _dlb("config", "validate", str(bad))
    assert out.returncode != 0 and "stale_afer_ms" in out.stdout + out.stderr


def _envoy_validate(path: Path, tier: str) -> subprocess.CompletedProcess[str]:
    from dlb.envoy.binary import envoy_binary

    return subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "--service-node", "dlb-x-0",
                           "--service-cluster", tier, "--service-zone", "us-east1", "--log-level", "error"],
                          capture_output=True, text=True, timeout=60)


def _tls_secret(tmp_path: Path) -> Path:
    """A folder laid out as a mounted kubernetes.io/tls Secret (ca.crt, tls.crt, tls.key): Envoy reads the files;
    beside it (``-sds``) the SDS files of components/mtls naming them."""
    import shutil

    from dlb.testbed.pki import dlb_pki

    tls, _ = dlb_pki(tmp_path / "pki", ("us-east1",))
    secret = tmp_path / "secret"
    secret.mkdir()
    for src, name in ((tls.ca, "ca.crt"), (tls.cert_for("leaf-us-east1"), "tls.crt"), (tls.key_for("leaf-us-east1"), "tls.key")):
        shutil.copy(src, secret / name)
    sds = tmp_path / "secret-sds"
    sds.mkdir()
    for name in ("tls-certificate.yaml", "validation-context.yaml"):
        (sds / name).write_text((K8S / "components" / "mtls" / name).read_text().replace("/etc/dlb-tls", str(secret)))
    return secret


@pytest.mark.envoy
def test_envoy_containers_start_on_their_bootstrap(tmp_path: Path) -> None:
    """Each Envoy container's own arguments (``--service-*`` from the downward API) on the bootstrap
    ConfigMap it mounts pass ``envoy --mode validate``."""
    from dlb.envoy.binary import envoy_binary

    seen = 0
    secret = _tls_secret(tmp_path)
    for d in overlay_dirs():
        docs = render(d)
        boots = bootstraps(docs)
        for w in _workloads(docs):
            spec = _pod(w)
            config_maps = {v["name"]: v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
            for c in spec["containers"]:
                if c.get("command") != ["envoy"]:
                    continue
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/envoy")
                cm = config_maps[mount["name"]]
                assert cm in boots, f"{d.relative_to(REPO)} {_name(w)}: mounts {cm}, which the overlay does not generate"
                path = tmp_path / f"{d.name}-{cm}.yaml"
                path.write_text(boots[cm].replace("/etc/dlb-tls", str(secret)))  # the cert-manager Secret a pod mounts
                args = [_substitute(a, w["spec"]["template"]) for a in c["args"]]
                args = [str(path) if a == "/etc/envoy/bootstrap.yaml" else a for a in args]
                out = subprocess.run([envoy_binary(), "--mode", "validate", *args], capture_output=True, text=True, timeout=60)
                assert out.returncode == 0, f"{d.relative_to(REPO)} {_name(w)} envoy {' '.join(args)}:\n{out.stdout}{out.stderr}"
                seen += 1
    assert seen >= 6


@pytest.mark.envoy
def test_envoy_validate_rejects_a_broken_bootstrap(tmp_path: Path) -> None:
    """The bootstrap check can fail: a name in a STATIC cluster is what Envoy 1.40 rejects."""
    boot = yaml.safe_load((K8S / "base" / "cell" / "bootstrap-root.yaml").read_text())
    boot["static_resources"]["clusters"][0]["type"] = "STATIC"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(boot))
    out = _envoy_validate(path, "dlb-root")
    assert out.returncode != 0 and "malformed IP address" in out.stdout + out.stderr


@pytest.mark.envoy
def test_mtls_overlay_envoy_is_configured_over_mtls(tmp_path: Path) -> None:
    """``overlays/cluster-us-mtls`` out of the box: a control plane whose only TLS setting is its mounted
    cert-manager Secret (``DLB_TLS_SECRET_DIR``) configures a leaf Envoy started on the overlay's own
    bootstrap, SDS files and Secret; the same Envoy with a Secret from another CA gets nothing."""
    import os
    import shutil
    import time

    from bounded_wait import until

    from dlb.envoy.binary import EnvoyProcess
    from dlb.procutil import free_port
    from dlb.testbed.pki import dlb_pki

    ours, theirs = dlb_pki(tmp_path / "pki", ("us-east1",))

    docs = render(K8S / "overlays" / "cluster-us-mtls")
    sds = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("dlb-envoy-sds"))

    def secret(name: str, files: Any, identity: str) -> Path:
        """The pod's Secret mount, and beside it (``-sds``) the overlay's SDS files naming it."""
        folder = tmp_path / name
        folder.mkdir()
        for src, dst in ((files.ca, "ca.crt"), (files.cert_for(identity), "tls.crt"), (files.key_for(identity), "tls.key")):
            shutil.copy(src, folder / dst)
        (tmp_path / f"{name}-sds").mkdir()
        for file, text in sds["data"].items():
            (tmp_path / f"{name}-sds" / file).write_text(text.replace("/etc/dlb-tls", str(folder)))
        return folder

    xds, status = free_port(), free_port()
    cfg = tmp_path / "dlb.yaml"
    cfg.write_text(yaml.safe_dump({
        "version": 1, "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}],
        "cells": [{"name": "us-east1", "servers": [f"127.0.0.1:{free_port()}"],
                   "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"}}]}))
    env = dict(os.environ, DLB_TLS_SECRET_DIR=str(secret("cp", ours, "control-plane")))
    cp = subprocess.Popen([sys.executable, "-m", "dlb.cli", "serve", "control-plane", "--config", str(cfg), "--xds",
                           f"127.0.0.1:{xds}", "--status", f"127.0.0.1:{status}", "--no-probe"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    boot = next(text for name, text in bootstraps(docs).items() if name.startswith("dlb-bootstrap-mtls-leaf"))
    envoys = []
    try:
        for name, files in (("leaf", ours), ("foreign", theirs)):
            admin = free_port()
            text = (boot.replace("/etc/dlb-tls", str(secret(name, files, "leaf-us-east1")))
                    .replace("dlb-control-plane.dlb-system.svc", "127.0.0.1").replace("port_value: 18000", f"port_value: {xds}")
                    .replace("port_value: 9901", f"port_value: {admin}").replace("port_value: 9902", f"port_value: {free_port()}"))
            path = tmp_path / f"{name}.yaml"
            path.write_text(text)
            envoys.append(EnvoyProcess(str(path), admin, extra_args=["--service-node", f"{name}-0", "--service-cluster", "dlb-leaf",
                                                                     "--service-zone", "us-east1"]))
            envoys[-1].start(ready_timeout=60)
        good, foreign = envoys

        def lds_updates(e: EnvoyProcess) -> int:
            return int(e.stats("listener_manager.lds.update_success").get("listener_manager.lds.update_success", "0"))

        until(lambda: lds_updates(good) >= 1, "the leaf Envoy's listeners came over mTLS xDS", timeout=30)
        assert good.stats("control_plane.connected_state")["control_plane.connected_state"] == "1"
        time.sleep(2.0)  # as long again for the foreign one, which has tried since its start
        assert foreign.stats("control_plane.connected_state")["control_plane.connected_state"] == "0"
        assert lds_updates(foreign) == 0
    finally:
        for e in envoys:
            e.stop()
        cp.terminate()
        cp.wait(10)
