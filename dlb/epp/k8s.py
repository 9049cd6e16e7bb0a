"""Following an InferencePool in Kubernetes: list + watch its pods, hand each new endpoint set to the EPP.

Why a thread: the official ``kubernetes`` client blocks (urllib3). The watcher runs beside the event loop and
passes each changed endpoint set, an immutable tuple, to a callback; :func:`dlb.epp.serve.run_epp` makes that
callback hop onto the loop (``call_soon_threadsafe``), so the ext_proc path never waits on the API server and
sees one set or the next, never half of one.

The pool object is read again at each watch renewal (``watch_timeout_s``): a changed selector or port list
starts a fresh list. The API's refusals become :class:`~dlb.epp.inferencepool.PoolError` naming the pool,
the verb and what to grant; at start they end the process, later they are logged and retried.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlb.epp.inferencepool import POOL_VERSIONS, PoolError, PoolSpec, apply_event, endpoints, pool_spec
from dlb.log import get_logger

log = get_logger("dlb.epp")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class PoolRef:
    """Which InferencePool (GIE's EPP flags ``--pool-name``, ``--pool-namespace``, ``--pool-group``)."""

    name: str
    namespace: str
    group: str = "inference.networking.k8s.io"

    @property
    def version(self) -> str:
        return POOL_VERSIONS[self.group]

    def __str__(self) -> str:
        return f"InferencePool {self.namespace}/{self.name} ({self.group}/{self.version})"


def default_namespace() -> str:
    """The pod's own namespace in a cluster, else ``default``."""
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def kube_client(kubeconfig: str | None) -> Any:
    """An ``ApiClient`` from ``kubeconfig``, else from the pod's service account (in-cluster)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise PoolError("--pool-name needs the kubernetes client: pip install 'dlb[k8s]'") from None
    if kubeconfig:
        import yaml

        if not Path(kubeconfig).is_file():
            raise PoolError(f"--kubeconfig {kubeconfig}: no such file")
        try:
            return config.new_client_from_config(config_file=kubeconfig)
        except (config.ConfigException, yaml.YAMLError, ValueError, KeyError, TypeError) as exc:
            raise PoolError(f"--kubeconfig {kubeconfig}: {' '.join(str(exc).split())}") from None
    try:
        c = client.Configuration()
        config.load_incluster_config(client_configuration=c)
        return client.ApiClient(c)
    except config.ConfigException as exc:
        raise PoolError(f"no Kubernetes API to read the pool from: {exc} (outside a cluster, pass --kubeconfig)") from None


def _refused(ref: PoolRef, what: str, exc: Any) -> PoolError:
    """An ApiException as an operator's error: which pool, which call, what to fix."""
    try:
        message = json.loads(exc.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = exc.reason or ""
    if exc.status == 403:
        return PoolError(f"{ref}: forbidden to {what} in namespace {ref.namespace} ({message}); the EPP's service account needs "
                         "get, list and watch on pods and inferencepools (a Role and RoleBinding)")
    if exc.status == 404 and what.startswith("get inferencepools"):
        return PoolError(f"{ref}: not found ({message}); check --pool-name/--pool-namespace/--pool-group and that the CRD is installed")
    return PoolError(f"{ref}: {what} failed with HTTP {exc.status} ({message})")


class PoolWatcher:
    """List + watch the pool's pods; ``publish`` gets each changed endpoint set (from this watcher's thread)."""

    def __init__(self, ref: PoolRef, api: Any, publish: Callable[[tuple[str, ...]], object], watch_timeout_s: int = 60,
                 retry_s: float = 2.0) -> None:
        from kubernetes import client

        self.ref, self.publish = ref, publish
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.spec: PoolSpec | None = None
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None
        self.last: tuple[str, ...] | None = None
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise _refused(self.ref, what, exc) from None
        except HTTPError as exc:
            raise PoolError(f"{self.ref}: {what}: cannot reach the Kubernetes API ({exc})") from None

    def read_pool(self) -> PoolSpec:
        r = self.ref
        obj = self._call(f"get inferencepools/{r.name}", self.custom.get_namespaced_custom_object, r.group, r.version, r.namespace,
                         "inferencepools", r.name, _request_timeout=30)
        return pool_spec(obj, str(r))

    def sync(self) -> tuple[str, ...]:
        """Read the pool and list its pods; publish and return the endpoint set. PoolError when refused."""
        spec = self.read_pool()
        resp = self._call("list pods", self.core.list_namespaced_pod, self.ref.namespace, label_selector=spec.label_selector,
                          _preload_content=False, _request_timeout=30)
        listed = json.loads(resp.data)
        self.spec, self.resource_version = spec, listed["metadata"].get("resourceVersion")
        self.pods = {p["metadata"]["name"]: p for p in listed.get("items") or ()}
        log.info("epp_pool_listed", pool=str(self.ref), selector=spec.label_selector, ports=list(spec.ports), pods=len(self.pods))
        return self._publish()

    def _publish(self) -> tuple[str, ...]:
        assert self.spec is not None
        eps = endpoints(self.spec, self.pods.values())
        if eps != self.last:
            self.last = eps
            self.publish(eps)
        return eps

    def watch_once(self) -> None:
        """One watch, from the last resource version until the server ends it; events applied as they come."""
        from kubernetes import watch

        assert self.spec is not None
        self._watch = w = watch.Watch()
        stream = w.stream(self.core.list_namespaced_pod, self.ref.namespace, label_selector=self.spec.label_selector,
                          resource_version=self.resource_version, timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                          deserialize=False, _request_timeout=self.watch_timeout_s + 30)
        from kubernetes.client.exceptions import ApiException

        try:
            for event in stream:
                apply_event(self.pods, event)
                self._publish()
                if self._stop.is_set():
                    break
        except ApiException as exc:  # 410 Gone (the version is too old) included: run() lists again
            raise _refused(self.ref, "watch pods", exc) from None
        if w.resource_version:
            self.resource_version = w.resource_version

    def run(self) -> None:
        """Watch until :meth:`stop`; a refused or broken watch is logged, then the pool is read and listed again."""
        from urllib3.exceptions import HTTPError

        renewal = False  # the first watch follows sync()'s list directly
        while not self._stop.is_set():
            try:
                if self.spec is None or (renewal and self.read_pool() != self.spec):
                    self.sync()
                renewal = True
                self.watch_once()
            except (PoolError, HTTPError, OSError, ValueError, KeyError) as exc:
                if self._stop.is_set():
                    return
                log.warning("epp_pool_watch_failed", pool=str(self.ref), error=str(exc))
                self.spec = None
                self._stop.wait(self.retry_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="dlb-epp-pool", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
