"""An InferencePool's members from the API server's JSON: ready pods only, each target port, bad pools named.

The fixtures (tests/fixtures/k8s) are a PodList, pod watch events and a v1 InferencePool in the API server's
wire format; the first test keeps every pod in them valid under Kubernetes 1.37's strict schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dlb.epp.inferencepool import PoolError, PoolSpec, PoolState, apply_event, endpoints, pool_spec, resource_version

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
POOL = "InferencePool llm/vllm"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / "pod-watch.jsonl").read_text().splitlines()]


def test_fixture_pods_are_valid_kubernetes_objects() -> None:
    pods = [dict(p, kind="Pod", apiVersion="v1") for p in load("pod-list.json")["items"]]  # a list's items carry no kind
    pods += [e["object"] for e in events() if e["type"] != "BOOKMARK"]
    for p in pods:
        kubernetes_validate.validate(p, "1.37", strict=True)
    assert len(pods) == 7


def test_ready_pods_of_the_listed_pool_are_its_endpoints() -> None:
    spec = pool_spec(load("inferencepool.json"), POOL)
    assert spec == PoolSpec(selector=(("app", "vllm-llama3-8b-instruct"),), ports=(8000,))
    assert spec.label_selector == "app=vllm-llama3-8b-instruct"
    # one Running + Ready pod; one Running but not Ready; one Pending with no IP yet
    assert endpoints(spec, load("pod-list.json")["items"]) == ("10.8.1.14:8000",)


def test_watch_events_change_the_set_in_order() -> None:
    spec = pool_spec(load("inferencepool.json"), POOL)
    pods = {p["metadata"]["name"]: p for p in load("pod-list.json")["items"]}
    seen = []
    for e in events():
        apply_event(pods, e)
        seen.append(endpoints(spec, pods.values()))
    assert seen == [
        ("10.8.1.14:8000", "10.8.2.7:8000"),  # the second pod turned Ready
        ("10.8.1.14:8000", "10.8.2.7:8000"),  # the third got an IP, not yet Ready
        ("10.8.2.7:8000",),  # the first is terminating (deletionTimestamp): out before it is gone
        ("10.8.2.7:8000",),  # then deleted
        ("10.8.2.7:8000",),  # a bookmark changes nothing
    ]


def test_each_target_port_is_an_endpoint_and_ipv6_is_bracketed() -> None:
    pod = load("pod-list.json")["items"][0]
    pod["status"]["podIP"] = "fd00:10:8::14"
    spec = pool_spec({"spec": {"selector": {"matchLabels": {"app": "vllm-llama3-8b-instruct"}}, "targetPorts": [{"number": 8000}, {"number": 8001}]}}, POOL)
    assert endpoints(spec, [pod]) == ("[fd00:10:8::14]:8000", "[fd00:10:8::14]:8001")


def test_v1alpha2_pool_shape() -> None:
    spec = pool_spec({"spec": {"selector": {"app": "vllm", "tier": "gpu"}, "targetPortNumber": 8000}}, POOL)
    assert spec.label_selector == "app=vllm,tier=gpu" and spec.ports == (8000,)


def test_a_pod_without_the_selectors_labels_is_not_a_member() -> None:
    spec = pool_spec(load("inferencepool.json"), POOL)
    pod = load("pod-list.json")["items"][0]
    pod["metadata"]["labels"] = {"app": "other"}
    assert endpoints(spec, [pod]) == ()


@pytest.mark.parametrize(("spec", "field"), [
    ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]}, "spec.selector.matchLabels must be a non-empty map"),
    ({"selector": {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "app", "operator": "Exists"}]}, "targetPorts": [{"number": 8000}]},
     "spec.selector.matchExpressions is not supported"),
    ({"selector": {"matchLabels": {"app~": "x"}}, "targetPorts": [{"number": 8000}]}, "key 'app~' is not a valid label name"),
    ({"selector": {"app": 3}, "targetPortNumber": 8000}, "spec.selector[app] value 3 is not a valid label value"),
    ({"selector": {"app": "x"}, "targetPortNumber": 0}, "spec.targetPortNumber must be distinct port numbers"),
    ({"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 8000}, {"number": 8000}]}, "spec.targetPorts[].number must be distinct"),
    (None, "spec is missing"),
])
def test_a_bad_pool_is_refused_naming_the_field(spec: Any, field: str) -> None:
    with pytest.raises(PoolError, match=r"^InferencePool llm/vllm: ") as err:
        pool_spec({"spec": spec} if spec is not None else {}, POOL)
    assert field in str(err.value)


def pool_event(kind: str, version: str = "2", name: str = "vllm", **spec: Any) -> dict[str, Any]:
    obj = load("inferencepool.json")
    obj["metadata"].update(name=name, resourceVersion=version)
    obj["spec"].update(spec)
    return {"type": kind, "object": obj}


def test_the_pools_own_watch_says_when_to_list_the_pods_again() -> None:
    state = PoolState("vllm", pool_spec(load("inferencepool.json"), POOL))
    assert not state.apply(pool_event("MODIFIED"), POOL)  # a status or annotation edit: same selector and ports
    assert state.apply(pool_event("MODIFIED", selector={"matchLabels": {"app": "v2"}}), POOL)
    assert state.spec.selector == (("app", "v2"),)
    assert state.apply(pool_event("MODIFIED", selector={"matchLabels": {"app": "v2"}}, targetPorts=[{"number": 8001}]), POOL)
    assert not state.apply(pool_event("MODIFIED", name="other", selector={"matchLabels": {"app": "x"}}), POOL)  # not this pool
    assert not state.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}, POOL)
    assert state.spec == PoolSpec((("app", "v2"),), (8001,))


def test_a_deleted_or_unusable_pool_keeps_the_last_spec() -> None:
    state = PoolState("vllm", pool_spec(load("inferencepool.json"), POOL))
    last = state.spec
    assert not state.apply(pool_event("DELETED"), POOL) and state.deleted and state.spec == last
    with pytest.raises(PoolError, match="matchExpressions is not supported"):
        state.apply(pool_event("ADDED", selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]}), POOL)
    assert not state.deleted and state.spec == last  # it exists again, but its spec cannot be followed
    assert not state.listed([], POOL) and state.deleted  # a list without it: gone
    assert state.listed([pool_event("ADDED", targetPorts=[{"number": 9000}])["object"]], POOL) and not state.deleted


def test_watch_events_carry_the_version_to_resume_from() -> None:
    assert [resource_version(e) for e in events()] == [e["object"]["metadata"].get("resourceVersion") for e in events()]
    assert resource_version({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == "9"
    assert resource_version({"type": "ADDED"}) is None
