"""Following an InferencePool in Kubernetes: list + watch its pods, hand each new endpoint set to the EPP.

Why a thread: the official ``kubernetes`` client blocks (urllib3). The watcher runs beside the event loop and
passes each changed endpoint set, an immutable tuple, to a callback; :func:`dlb.epp.serve.run_epp` makes that
callback hop onto the loop (``call_soon_threadsafe``), so the ext_proc path never waits on the API server and
sees one set or the next, never half of one.

Two watches, each on its own thread: the pods (list, then watch from the list's version) and the
InferencePool object itself (``fieldSelector=metadata.name``), so a changed selector or port list cuts the
pod watch short and lists again within a round trip, not at the next renewal. A deleted pool keeps the last
endpoints (logged, and ``dlb_epp_pool_deleted``) until it is back. The API's refusals become
:class:`~dlb.epp.inferencepool.PoolError` naming the pool, the verb and what to grant; at start they end the
process, later they are logged, counted and retried.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlb.epp.inferencepool import POOL_VERSIONS, PoolError, PoolSpec, PoolState, apply_event, endpoints, pool_spec, resource_version
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


#: The two watches, as the ``watch`` label of ``dlb_epp_pool_watch_*`` names them.
PODS, POOL = "pods", "inferencepool"


@dataclass
class WatchStats:
    """What the watches did, for the ``dlb_epp_pool_*`` metrics: plain values the watch threads write and a scrape reads."""

    up: dict[str, bool] = field(default_factory=lambda: {PODS: False, POOL: False})
    errors: dict[str, int] = field(default_factory=lambda: {PODS: 0, POOL: 0})
    spec_changes: int = 0


class PoolWatcher:
    """List + watch the pool's pods and the pool itself; ``publish`` gets each changed endpoint set (from a watch thread)."""

    def __init__(self, ref: PoolRef, api: Any, publish: Callable[[tuple[str, ...]], object], watch_timeout_s: int = 60,
                 retry_s: float = 2.0) -> None:
        from kubernetes import client

        self.ref, self.publish = ref, publish
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.pool: PoolState | None = None
        #: The spec the pods below were listed with (the pool's may be newer while they are listed again).
        self.spec: PoolSpec | None = None
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None
        self.last: tuple[str, ...] | None = None
        self.stats = WatchStats()
        self._stop = threading.Event()
        self._relist = threading.Event()  # the pool's spec changed: the pod thread lists again
        self._lock = threading.Lock()  # guards _open against an interrupt racing a watch being opened
        self._open: dict[str, Any] = {}
        self._pool_version: str | None = None  # where the pool watch resumes; None: list the pool first
        self._threads: list[threading.Thread] = []

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
        """At start: read the pool and list its pods; publish and return the endpoint set. PoolError when refused."""
        self.pool = PoolState(self.ref.name, self.read_pool())
        return self.list_pods()

    def list_pods(self) -> tuple[str, ...]:
        """List the pods of the pool's spec now in force; the pod watch resumes from this list."""
        assert self.pool is not None
        spec = self.pool.spec
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

    def _follow(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                on_event: Callable[[Mapping[str, Any]], object], cancel: threading.Event | None = None) -> None:
        """One watch of ``what`` until the server ends it, :meth:`stop` or ``cancel`` (set by :meth:`_interrupt`) cuts it."""
        from kubernetes.watch.watch import iter_resp_lines

        resp = self._call(f"watch {what}", fn, *args, watch=True, timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                          _preload_content=False, _request_timeout=self.watch_timeout_s + 30, **kwargs)
        with self._lock:
            self._open[what] = resp
            cut = self._stop.is_set() or (cancel is not None and cancel.is_set())  # set before this watch could be cut
        try:
            self.stats.up[what] = True
            for line in () if cut else iter_resp_lines(resp):
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":  # 410 Gone (the version is too old) included: the caller lists again
                    obj = event.get("object") or {}
                    raise PoolError(f"{self.ref}: watch {what} ended with HTTP {obj.get('code')} ({obj.get('message', '')})")
                on_event(event)
                if self._stop.is_set():
                    return
        finally:
            with self._lock:
                self._open.pop(what, None)
            resp.close()
            resp.release_conn()

    def _interrupt(self, what: str) -> None:
        """Unblock the read of an open watch from another thread (the socket is shut for reading)."""
        with self._lock:
            resp = self._open.get(what)
            if resp is not None:
                try:
                    resp.shutdown()
                except (ValueError, RuntimeError, OSError):  # already released or closed: nothing to unblock
                    pass

    def _on_pod(self, event: Mapping[str, Any]) -> None:
        apply_event(self.pods, event)
        self.resource_version = resource_version(event) or self.resource_version
        self._publish()

    def run_pods(self) -> None:
        """Watch the pods until :meth:`stop`; renewals resume from the last version, a failure or a new spec lists again."""
        from urllib3.exceptions import HTTPError

        listed = True  # sync() listed just now
        while not self._stop.is_set():
            try:
                if not listed or self._relist.is_set():
                    self._relist.clear()
                    self.list_pods()
                listed = True
                assert self.spec is not None
                self._follow(PODS, self.core.list_namespaced_pod, (self.ref.namespace,),
                             {"label_selector": self.spec.label_selector, "resource_version": self.resource_version},
                             self._on_pod, cancel=self._relist)
            except (PoolError, HTTPError, OSError, ValueError, KeyError) as exc:
                if self._stop.is_set():
                    return
                if self._relist.is_set():  # cut short on purpose: the pool changed
                    continue
                self._failed(PODS, exc)
                listed = False

    def _failed(self, what: str, exc: Exception) -> None:
        self.stats.up[what] = False
        self.stats.errors[what] += 1
        log.warning("epp_pool_watch_failed", pool=str(self.ref), watch=what, error=str(exc))
        self._stop.wait(self.retry_s)

    def _on_pool(self, event: Mapping[str, Any]) -> None:
        assert self.pool is not None
        self._pool_version = resource_version(event) or self._pool_version
        self._pool_update(functools.partial(self.pool.apply, event, str(self.ref)))

    def _pool_update(self, update: Callable[[], bool]) -> None:
        """Apply a pool event or list; an edit DLB cannot follow (PoolError) keeps the last spec and members."""
        assert self.pool is not None
        was_deleted = self.pool.deleted
        try:
            changed = update()
        except PoolError as exc:
            self.stats.errors[POOL] += 1
            log.warning("epp_pool_unusable", pool=str(self.ref), error=str(exc), keeping=list(self.last or ()))
            changed = False
        self._changed(was_deleted, changed)

    def _changed(self, was_deleted: bool, changed: bool) -> None:
        assert self.pool is not None
        if self.pool.deleted and not was_deleted:
            log.warning("epp_pool_deleted", pool=str(self.ref), keeping=list(self.last or ()))
        elif was_deleted and not self.pool.deleted:
            log.info("epp_pool_restored", pool=str(self.ref))
        if changed:
            self.stats.spec_changes += 1
            log.info("epp_pool_spec_changed", pool=str(self.ref), selector=self.pool.spec.label_selector, ports=list(self.pool.spec.ports))
            with self._lock:
                self._relist.set()
            self._interrupt(PODS)

    def run_pool(self) -> None:
        """Watch the InferencePool object until :meth:`stop`; a failure lists it again (its state is then re-read whole)."""
        from urllib3.exceptions import HTTPError

        r = self.ref
        coords = (r.group, r.version, r.namespace, "inferencepools")
        only = f"metadata.name={r.name}"
        self._pool_version = None
        while not self._stop.is_set():
            try:
                if self._pool_version is None:
                    listed = self._call("list inferencepools", self.custom.list_namespaced_custom_object, *coords, field_selector=only,
                                        _request_timeout=30)
                    assert self.pool is not None
                    pool, items = self.pool, listed.get("items") or ()
                    self._pool_version = (listed.get("metadata") or {}).get("resourceVersion")
                    self._pool_update(functools.partial(pool.listed, items, str(r)))
                self._follow(POOL, self.custom.list_namespaced_custom_object, coords,
                             {"field_selector": only, "resource_version": self._pool_version}, self._on_pool)
            except (PoolError, HTTPError, OSError, ValueError, KeyError, AttributeError) as exc:
                if self._stop.is_set():
                    return
                self._pool_version = None
                self._failed(POOL, exc)

    def start(self) -> None:
        for name, target in (("dlb-epp-pods", self.run_pods), ("dlb-epp-pool", self.run_pool)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for what in (PODS, POOL):
            self._interrupt(what)
