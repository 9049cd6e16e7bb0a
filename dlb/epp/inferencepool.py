"""An InferencePool's members, the pure part: the pool's selector and ports, and the ready pods' ``ip:port``.

Why a pure module: the rules (which pods count, which ports, what a bad pool is) are tested on the JSON
the API server returns, without one; :mod:`dlb.epp.k8s` only moves that JSON here from a list and a watch.

Both API versions GIE has shipped are read: ``inference.networking.k8s.io/v1`` (``selector.matchLabels``,
``targetPorts[].number``, each port its own endpoint) and ``inference.networking.x-k8s.io/v1alpha2``
(``selector`` as a plain map, ``targetPortNumber``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dlb.config.model import INFERENCE_POOL_GROUPS
from dlb.errors import DlbError

#: API group → the version of it read (GIE's released InferencePool versions).
POOL_VERSIONS = INFERENCE_POOL_GROUPS
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


class PoolError(DlbError, ValueError):
    """The InferencePool cannot be followed: missing, unreadable (RBAC) or with a selector DLB cannot use."""


@dataclass(frozen=True)
class PoolSpec:
    """What membership needs from a pool: its label selector and the ports each member serves on."""

    selector: tuple[tuple[str, str], ...]
    ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        """The selector as the API's ``labelSelector`` query (``k=v,k2=v2``)."""
        return ",".join(f"{k}={v}" for k, v in self.selector)


def pool_spec(obj: Mapping[str, Any], where: str) -> PoolSpec:
    """The selector and ports of an InferencePool object (as the API returns it); PoolError names the bad field."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise PoolError(f"{where}: spec is missing")
    sel: Any = spec.get("selector")
    field = "spec.selector"
    if isinstance(sel, Mapping) and ("matchLabels" in sel or "matchExpressions" in sel):  # v1: a LabelSelector
        if sel.get("matchExpressions"):
            raise PoolError(f"{where}: {field}.matchExpressions is not supported (an InferencePool selects by matchLabels)")
        sel, field = sel.get("matchLabels"), f"{field}.matchLabels"
    if not isinstance(sel, Mapping) or not sel:
        raise PoolError(f"{where}: {field} must be a non-empty map of label: value (an empty one would select every pod)")
    for k, v in sel.items():
        if not isinstance(k, str) or not _KEY.match(k):
            raise PoolError(f"{where}: {field} key {k!r} is not a valid label name")
        if not isinstance(v, str) or not _VALUE.match(v):
            raise PoolError(f"{where}: {field}[{k}] value {v!r} is not a valid label value")
    if "targetPorts" in spec:
        raw, pfield = [p.get("number") if isinstance(p, Mapping) else p for p in spec["targetPorts"] or ()], "spec.targetPorts[].number"
    else:
        raw, pfield = [spec.get("targetPortNumber")], "spec.targetPortNumber"
    ports = tuple(p for p in raw if isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535)
    if not ports or len(ports) != len(raw) or len(set(ports)) != len(ports):
        raise PoolError(f"{where}: {pfield} must be distinct port numbers 1..65535, got {raw}")
    return PoolSpec(tuple(sorted(sel.items())), ports)


def is_ready(pod: Mapping[str, Any]) -> bool:
    """A pod that takes requests: Running, condition Ready True, an IP, not being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def matches(spec: PoolSpec, pod: Mapping[str, Any]) -> bool:
    """The pod carries every label of the selector (the list is filtered by the API; a watch event is checked again)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in spec.selector)


def endpoints(spec: PoolSpec, pods: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Every ready member's ``ip:port`` (one per target port), sorted: the pool's endpoint set."""
    out: set[str] = set()
    for pod in pods:
        if matches(spec, pod) and is_ready(pod):
            try:
                ip = ipaddress.ip_address(pod["status"]["podIP"])
            except ValueError:
                continue
            host = f"[{ip}]" if ip.version == 6 else str(ip)  # the form the leaf state and Envoy's ORIGINAL_DST use
            out.update(f"{host}:{p}" for p in spec.ports)
    return tuple(sorted(out))


def apply_event(pods: dict[str, Mapping[str, Any]], event: Mapping[str, Any]) -> None:
    """A watch event (``ADDED``/``MODIFIED``/``DELETED``; ``BOOKMARK`` carries nothing) applied to ``pods`` by name."""
    obj = event.get("object") or {}
    name = (obj.get("metadata") or {}).get("name")
    if name is None:
        return
    if event.get("type") == "DELETED":
        pods.pop(name, None)
    elif event.get("type") in ("ADDED", "MODIFIED"):
        pods[name] = obj


def resource_version(event: Mapping[str, Any]) -> str | None:
    """The version a watch event brings the collection to (a ``BOOKMARK`` too): where a renewed watch resumes."""
    return ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")


@dataclass
class PoolState:
    """The InferencePool as its own watch last saw it: the spec in force and whether the object is gone.

    Why keep the last spec when the pool is deleted or becomes unusable: the gateway may still route to
    this EPP (a delete + re-apply, a bad edit), and the last good members are a better answer than 503.
    """

    name: str
    spec: PoolSpec
    deleted: bool = False

    def apply(self, event: Mapping[str, Any], where: str) -> bool:
        """One pool watch event; True when the spec changed (list the pods again). A bad spec raises PoolError, keeping the last."""
        obj = event.get("object") or {}
        if (obj.get("metadata") or {}).get("name") != self.name:
            return False
        if event.get("type") == "DELETED":
            self.deleted = True
            return False
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return False
        self.deleted = False
        spec = pool_spec(obj, where)
        changed, self.spec = spec != self.spec, spec
        return changed

    def listed(self, items: Iterable[Mapping[str, Any]], where: str) -> bool:
        """A list of pools (filtered to this name) as the watch's starting point; no such item: the pool is gone."""
        for obj in items:
            if (obj.get("metadata") or {}).get("name") == self.name:
                return self.apply({"type": "ADDED", "object": obj}, where)
        self.deleted = True
        return False
