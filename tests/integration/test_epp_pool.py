"""``dlb serve epp --pool-name``: the real ``kubernetes`` client lists and watches an InferencePool's pods from a
local HTTP server that answers as the API server does (JSON from tests/fixtures/k8s, the watch as chunked
lines), and the picks follow: ready pods only, a terminating pod out, no ready pod → 503. A refused or
missing pool or a selector DLB cannot use ends the start with an error saying which and what to fix."""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest
import yaml
from bounded_wait import until
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from scrape import metric_samples

from dlb.epp import protocol
from dlb.epp.inferencepool import PoolError
from dlb.epp.k8s import kube_client
from dlb.procutil import free_port
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.testbed.process import ServiceProcess

pytest.importorskip("kubernetes")
pytestmark = pytest.mark.timeout(120)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
NS, POOL = "llm", "vllm-llama3-8b-instruct"
POOLS_PATH = f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools"
POOL_PATH = f"{POOLS_PATH}/{POOL}"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """The API server's error body (a ``Status``)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


FORBIDDEN = status(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:llm:dlb-epp" cannot list resource "pods" in API group "" '
                   'in the namespace "llm"')


def selected(pod: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """The pod carries every ``k=v`` of the request's labelSelector (the API server filters the list so)."""
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, _, v in (t.partition("=") for t in ",".join(query.get("labelSelector", [])).split(",") if t))


class ApiServer:
    """Answers the pool's GET, list and watch, the pods' list and watch; ``events`` feeds the open pod watch and
    ``pool_events`` the pool's, one chunk per event."""

    def __init__(self, pool: dict[str, Any] | None = None, pods_error: dict[str, Any] | None = None, pods: dict[str, Any] | None = None) -> None:
        self.pool = pool if pool is not None else json.loads((FIXTURES / "inferencepool.json").read_text())
        self.pods = pods if pods is not None else json.loads((FIXTURES / "pod-list.json").read_text())
        self.pods_error = pods_error
        self.requests: list[tuple[str, dict[str, list[str]], str]] = []
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.pool_events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stopping = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def send_json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                q = parse_qs(url.query)
                api.requests.append((url.path, q, self.headers.get("Authorization", "")))
                if url.path == POOL_PATH and "code" not in api.pool:
                    self.send_json(200, api.pool)
                elif url.path == POOL_PATH:
                    self.send_json(api.pool["code"], api.pool)
                elif url.path == POOLS_PATH and q.get("watch") == ["true"]:
                    self.watch(api.pool_events)
                elif url.path == POOLS_PATH:  # the list the pool watch starts from (fieldSelector: this pool's name)
                    items = [api.pool] if "code" not in api.pool and q.get("fieldSelector") == [f"metadata.name={POOL}"] else []
                    self.send_json(200, {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePoolList",
                                         "metadata": {"resourceVersion": "7"}, "items": items})
                elif url.path == PODS_PATH and api.pods_error:
                    self.send_json(api.pods_error["code"], api.pods_error)
                elif url.path == PODS_PATH and q.get("watch") == ["true"]:
                    self.watch(api.events)
                elif url.path == PODS_PATH:
                    self.send_json(200, dict(api.pods, items=[p for p in api.pods["items"] if selected(p, q)]))
                else:
                    self.send_json(404, status(404, "NotFound", "the server could not find the requested resource"))

            def watch(self, events: queue.Queue[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                while not api.stopping.is_set():
                    try:
                        event = events.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if event["type"] == "END":  # the watch's timeoutSeconds ran out
                        break
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    if event["type"] == "ERROR":  # the API server ends a watch after its error
                        break
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> str:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stub",
            "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{self.server.server_port}"}}],
            "users": [{"name": "epp", "user": {"token": "epp-token"}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "epp", "namespace": NS}}]}))
        return str(path)


def epp_args(tmp_path: Path, api: ApiServer, port: int, flags: bool = False) -> list[str]:
    """The EPP's command line: the pool from the cell's ``inference_pool`` (no servers listed), or with ``flags``
    from ``--pool-name``/``--pool-namespace`` over a cell whose servers the pool replaces."""
    cell: dict[str, Any] = {"name": "pool", "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{port}"}}
    if flags:
        cell["servers"] = [f"{POOL}.{NS}.svc.cluster.local:8000"]  # not resolved: the pool replaces it
    else:
        cell["inference_pool"] = {"name": POOL, "namespace": NS}
    cfg = {"version": 1, "cells": [cell], "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    (tmp_path / "dlb.yaml").write_text(yaml.safe_dump(cfg))
    pool = ["--pool-name", POOL, "--pool-namespace", NS] if flags else []
    return ["--config", str(tmp_path / "dlb.yaml"), "--cell", "pool", "--scrape-period-ms", "0", "--metrics", "127.0.0.1:0", *pool,
            "--kubeconfig", api.kubeconfig(tmp_path / "kubeconfig")]


def watching(api: ApiServer) -> bool:
    """Both watches are open: the pods' and the InferencePool's."""
    return all(any(p == path and q.get("watch") == ["true"] for p, q, _ in api.requests) for path in (PODS_PATH, POOLS_PATH))


def picked(port: int, only: str | None = None) -> str | int:
    """The endpoint one pick chose (within the gateway's subset hint ``only``), or the immediate response's status."""
    req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions")])))
    if only:
        req.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].update({protocol.SUBSET_KEY: only})
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process", request_serializer=ep.ProcessingRequest.SerializeToString,
                                response_deserializer=ep.ProcessingResponse.FromString)
        r = next(iter(call(iter([req]), timeout=5)))
    if r.HasField("immediate_response"):
        return int(r.immediate_response.status.code)
    return {h.header.key: h.header.raw_value.decode() for h in r.request_headers.response.header_mutation.set_headers}[
        "x-gateway-destination-endpoint"]


def replicas(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(source_cell="root"), timeout=5).replicas


def test_picks_follow_the_pools_ready_pods(tmp_path: Path) -> None:
    port = free_port()
    watch = [json.loads(line) for line in (FIXTURES / "pod-watch.jsonl").read_text().splitlines()]
    with ApiServer() as api, ServiceProcess("epp", *epp_args(tmp_path, api, port)):
        assert picked(port) == "10.8.1.14:8000" and picked(port, "10.8.2.7:8000") == 503  # the list's one Running + Ready pod
        until(lambda: watching(api), "the EPP watches the pods and the pool")
        (pool_path, _, auth), (_, list_q, _) = api.requests[:2]
        watch_q = next(q for p, q, _ in api.requests if p == PODS_PATH and q.get("watch"))
        assert pool_path == POOL_PATH and auth == "Bearer epp-token" and list_q["labelSelector"] == ["app=vllm-llama3-8b-instruct"]
        assert watch_q["labelSelector"] == list_q["labelSelector"] and watch_q["resourceVersion"] == ["48305"]  # from the list
        api.events.put(watch[0])  # the second pod turns Ready
        until(lambda: picked(port, "10.8.2.7:8000") == "10.8.2.7:8000", "the ready pod joins the pool")
        assert picked(port, "10.8.1.14:8000") == "10.8.1.14:8000" and replicas(port) == 2
        for e in watch[1:]:  # the third gets an IP (not Ready); the first terminates, then is deleted; a bookmark
            api.events.put(e)
        until(lambda: picked(port, "10.8.1.14:8000") == 503, "the terminating pod leaves the pool")
        assert {picked(port) for _ in range(8)} == {"10.8.2.7:8000"} and replicas(port) == 1
        assert picked(port, "10.8.3.22:8000") == 503  # has an IP, not Ready
        unready = copy.deepcopy(watch[0])
        for c in unready["object"]["status"]["conditions"]:
            c["status"] = "False" if c["type"] in ("Ready", "ContainersReady") else c["status"]
        api.events.put(unready)
        until(lambda: picked(port) == 503, "no ready pod: every request gets 503")
        api.events.put(watch[0])
        until(lambda: picked(port) == "10.8.2.7:8000", "the pod is back")


def test_a_pool_with_no_ready_pod_answers_503_until_one_is(tmp_path: Path) -> None:
    port = free_port()
    pods = json.loads((FIXTURES / "pod-list.json").read_text())
    pods["items"] = pods["items"][1:]  # Running but not Ready, and Pending
    watch = [json.loads(line) for line in (FIXTURES / "pod-watch.jsonl").read_text().splitlines()]
    with ApiServer(pods=pods) as api, ServiceProcess("epp", *epp_args(tmp_path, api, port)):
        assert picked(port) == 503
        api.events.put(watch[0])  # the second pod turns Ready
        until(lambda: picked(port) == "10.8.2.7:8000", "the first ready pod is picked")



def test_an_expired_watch_lists_again(tmp_path: Path) -> None:
    """410 Gone (the watch's resourceVersion is too old, as after an API server restart): list again, go on.
    (The pool named by flags here, over a cell's servers.)"""
    port = free_port()
    watch = [json.loads(line) for line in (FIXTURES / "pod-watch.jsonl").read_text().splitlines()]
    with ApiServer() as api, ServiceProcess("epp", *epp_args(tmp_path, api, port, flags=True)):
        until(lambda: watching(api), "the EPP watches the pods and the pool")
        api.pods = dict(api.pods, metadata={"resourceVersion": "50001"}, items=[watch[0]["object"]])  # only the second pod, Ready
        api.events.put({"type": "ERROR", "object": status(410, "Expired", "too old resource version: 48305 (50000)")})
        until(lambda: picked(port, "10.8.1.14:8000") == 503, "the fresh list replaces the pool")
        assert picked(port) == "10.8.2.7:8000"
        until(lambda: [q.get("resourceVersion") for p, q, _ in api.requests if p == PODS_PATH and q.get("watch")][-1] == ["50001"],
              "watching from the new list")
        assert [p for p, q, _ in api.requests if p == PODS_PATH and not q.get("watch")] == [PODS_PATH] * 2


@pytest.mark.parametrize(("api_kwargs", "message"), [
    ({"pods_error": FORBIDDEN}, "forbidden to list pods in namespace llm (pods is forbidden: User"),
    ({"pool": status(404, "NotFound", f'inferencepools.inference.networking.k8s.io "{POOL}" not found')}, "not found"),
    ({"pool": {"spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}, "targetPorts": [{"number": 8000}]}}},
     "spec.selector.matchExpressions is not supported"),
])
def test_a_pool_it_cannot_follow_ends_the_start(tmp_path: Path, api_kwargs: dict[str, Any], message: str) -> None:
    with ApiServer(**api_kwargs) as api:
        epp = ServiceProcess("epp", *epp_args(tmp_path, api, free_port()), ready_timeout=60)
        with pytest.raises(RuntimeError, match="exited with 1") as err:
            epp.start()
    assert f"dlb: InferencePool {NS}/{POOL} (inference.networking.k8s.io/v1): " in str(err.value)
    assert message in str(err.value)


def pool_event(api: ApiServer, kind: str, version: str, **spec: Any) -> dict[str, Any]:
    """A watch event of the InferencePool: the stand-in's pool with ``spec`` fields replaced, at ``version``."""
    obj = copy.deepcopy(api.pool)
    obj["metadata"]["resourceVersion"] = version
    obj["spec"].update(spec)
    return {"type": kind, "object": obj}


def test_a_changed_selector_relists_the_pods_within_seconds(tmp_path: Path) -> None:
    """The pool's own watch sees a new selector and cuts the pod watch short: the new members serve within seconds,
    not at the pod watch's renewal (60 s)."""
    port = free_port()
    with ApiServer() as api, ServiceProcess("epp", *epp_args(tmp_path, api, port)):
        until(lambda: watching(api), "the EPP watches the pods and the pool")
        pool_q = next(q for p, q, _ in api.requests if p == POOLS_PATH and q.get("watch"))
        assert pool_q["fieldSelector"] == [f"metadata.name={POOL}"] and pool_q["resourceVersion"] == ["7"]
        assert picked(port) == "10.8.1.14:8000"
        v2 = copy.deepcopy(api.pods["items"][0])
        v2["metadata"].update(name="llama-v2-0", labels={"app": "llama-v2"})
        v2["status"]["podIP"] = "10.8.4.5"
        api.pods = dict(api.pods, items=[*api.pods["items"], v2])  # the stand-in filters by labelSelector, as the API does
        t0 = time.monotonic()
        api.pool_events.put(pool_event(api, "MODIFIED", "8", selector={"matchLabels": {"app": "llama-v2"}}))
        until(lambda: picked(port) == "10.8.4.5:8000", "the new selector's pod is the pool", timeout=10)
        took = time.monotonic() - t0
        print(f"selector change to first pick on the new pod: {took:.2f} s")
        assert took < 5, f"the selector change took {took:.1f} s"
        assert picked(port, "10.8.1.14:8000") == 503  # the old selector's pod is out
        lists = [q["labelSelector"] for p, q, _ in api.requests if p == PODS_PATH and not q.get("watch")]
        assert lists == [["app=vllm-llama3-8b-instruct"], ["app=llama-v2"]]
        api.pool_events.put(pool_event(api, "MODIFIED", "9", selector={"matchLabels": {"app": "llama-v2"}},
                                       targetPorts=[{"number": 8001}, {"number": 8002}]))
        until(lambda: picked(port, "10.8.4.5:8002") == "10.8.4.5:8002", "the new ports are the endpoints", timeout=10)
        assert picked(port, "10.8.4.5:8000") == 503


def test_a_deleted_pool_keeps_the_last_endpoints(tmp_path: Path) -> None:
    """DELETED: keep picking the last members (logged); an unusable edit is kept out too; back: follow it again."""
    port = free_port()
    with ApiServer() as api, ServiceProcess("epp", *epp_args(tmp_path, api, port)) as epp:
        until(lambda: watching(api), "the EPP watches the pods and the pool")
        api.pool_events.put(pool_event(api, "DELETED", "8"))
        until(lambda: "epp_pool_deleted" in epp.log_tail(80), "the delete is logged")
        assert {picked(port) for _ in range(5)} == {"10.8.1.14:8000"}
        m = metric_samples(f"127.0.0.1:{epp.ready['metrics']}")
        assert m["dlb_epp_pool_source{state=deleted}"] == 1 and m["dlb_epp_pool_endpoints"] == 1
        api.pool_events.put(pool_event(api, "ADDED", "9", selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]}))
        until(lambda: "epp_pool_unusable" in epp.log_tail(80), "the unusable pool is logged")
        assert picked(port) == "10.8.1.14:8000"
        api.pool_events.put(pool_event(api, "MODIFIED", "10", targetPorts=[{"number": 8001}]))
        until(lambda: picked(port) == "10.8.1.14:8001", "the pool is back, with its new port", timeout=10)
        assert "epp_pool_restored" in epp.log_tail(80)
        m = metric_samples(f"127.0.0.1:{epp.ready['metrics']}")
        assert m["dlb_epp_pool_source{state=watching}"] == 1 and m["dlb_epp_pool_source{state=deleted}"] == 0
        assert m["dlb_epp_pool_updates_total{what=spec}"] == 1 and m["dlb_epp_pool_updates_total{what=endpoints}"] == 1
        assert m["dlb_epp_pool_watch_errors_total{watch=inferencepool}"] == 1  # the unusable edit
        assert m["dlb_epp_pool_watch_errors_total{watch=pods}"] == 0


def test_a_refusal_while_serving_keeps_the_last_endpoints(tmp_path: Path) -> None:
    """RBAC revoked mid-run: the relist is refused (logged, retried), picks go on to the last pool, and resume following it."""
    port = free_port()
    watch = [json.loads(line) for line in (FIXTURES / "pod-watch.jsonl").read_text().splitlines()]
    with ApiServer() as api, ServiceProcess("epp", *epp_args(tmp_path, api, port)) as epp:
        until(lambda: watching(api), "the EPP watches the pods and the pool")
        api.pods_error = FORBIDDEN
        api.events.put({"type": "ERROR", "object": status(410, "Expired", "too old resource version")})
        lists = lambda: [p for p, q, _ in api.requests if p == PODS_PATH and not q.get("watch")]
        until(lambda: len(lists()) >= 3, "the refused list is retried")
        assert {picked(port) for _ in range(5)} == {"10.8.1.14:8000"}
        m = metric_samples(f"127.0.0.1:{epp.ready['metrics']}")
        assert m["dlb_epp_pool_watch_errors_total{watch=pods}"] >= 2 and m["dlb_epp_pool_source{state=watch_down}"] == 1
        assert "forbidden to list pods" in epp.log_tail(80)
        api.pods_error = None
        until(lambda: [q.get("watch") for p, q, _ in api.requests if p == PODS_PATH][-1] == ["true"], "watching again")
        api.events.put(watch[0])
        until(lambda: picked(port, "10.8.2.7:8000") == "10.8.2.7:8000", "following the pool again")


def test_a_missing_or_broken_kubeconfig_is_named(tmp_path: Path) -> None:
    """(Here, not in tests/unit: importing the kubernetes client opens a socket.)"""
    with pytest.raises(PoolError, match=r"^--kubeconfig /no/such/kubeconfig: no such file$"):
        kube_client("/no/such/kubeconfig")
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [\n")
    with pytest.raises(PoolError, match=rf"^--kubeconfig {bad}: .*line 2"):
        kube_client(str(bad))
