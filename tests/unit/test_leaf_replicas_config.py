"""``cells[].leaf.replicas``: the config field, and what each part builds from it (roots' cluster and
probe targets, each replica's leaf Envoy and agent addresses, the control plane's per-replica snapshots)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from envoy.config.core.v3 import base_pb2

from dlb.config import ConfigError, config_from_dict, parse_config
from dlb.config.resources import topology
from dlb.control_plane.service import dlb_node_key, leaf_key
from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap
from dlb.envoy.contract import LEAF_HEALTH_PATH
from dlb.envoy.root_token import root_token
from dlb.ext_proc.root_xds import config_probes, probe_targets

REPLICA = {"address": "127.0.0.1:10011", "probe": "127.0.0.1:9011"}


def config(leaf_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "version": 1,
        "cells": [
            {"name": "a", "leaf": {"address": "127.0.0.1:10010", "probe": "127.0.0.1:9010", **(leaf_extra or {"replicas": [REPLICA]})},
             "root": {"address": "127.0.0.1:10000", "ext_proc": "127.0.0.1:18080"}, "servers": ["127.0.0.1:8010"]},
            {"name": "b", "leaf": {"address": "127.0.0.1:10020", "probe": "127.0.0.1:9020"}, "servers": ["127.0.0.1:8020"]},
        ],
        "network": {"one_way_ms": {"a": {"b": 10}}},
        "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
    }


def problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_dump(raw), "t.yaml")
    assert all(p.file == "t.yaml" for p in info.value.problems)
    return [(p.path, p.reason) for p in info.value.problems]


def test_replicas_load_and_each_has_its_own_addresses() -> None:
    cfg = config_from_dict(config())
    a = cfg.cell("a")
    assert [str(r.address) for r in a.leaf.all_replicas()] == ["127.0.0.1:10010", "127.0.0.1:10011"]
    view = cfg.leaf_replica("a", 1)
    assert str(view.cell("a").leaf.probe) == "127.0.0.1:9011" and view.cell("b") == cfg.cell("b")
    # Each replica's access log defaults from its own probe address: two agents never share one.
    assert view.cell("a").leaf.access_log_address() != a.leaf.access_log_address()
    # The fleet's root token, not one derived from the view's addresses.
    assert root_token(view) == root_token(cfg)
    with pytest.raises(KeyError, match=r"leaf\.replicas"):
        cfg.leaf_replica("a", 2)


@pytest.mark.parametrize(("extra", "path", "reason"), [
    ({"replicas": [{"probe": "127.0.0.1:9011"}]}, "cells[0].leaf.replicas[0].address", "required"),
    ({"replicas": [{"address": "127.0.0.1:10010", "probe": "127.0.0.1:9011"}]}, "cells[0].leaf.replicas[0].address",
     "also used by cells[0].leaf.address"),
    ({"replicas": [dict(REPLICA, ext_proc="127.0.0.1:9111")]}, "cells[0].leaf.replicas[0].ext_proc", "only when leaf.ext_proc"),
    ({"ext_proc": "127.0.0.1:9100", "replicas": [REPLICA]}, "cells[0].leaf.replicas[0].ext_proc", "required"),
    ({"replicas": [dict(REPLICA, port=1)]}, "cells[0].leaf.replicas[0].port", "unknown key"),
    ({"replicas": REPLICA}, "cells[0].leaf.replicas", "must be a list"),
])
def test_bad_replicas_are_named_by_field(extra: dict[str, Any], path: str, reason: str) -> None:
    found = problems(config(extra))
    assert any(p == path and reason in r for p, r in found), found


def test_a_foreign_cell_has_no_leaf_replicas() -> None:
    raw = config({"source": "gie", "replicas": [REPLICA]})
    assert any(p == "cells[0].leaf.replicas" for p, _ in problems(raw))


def test_the_roots_cell_cluster_has_every_replica_and_retries_on_another() -> None:
    cfg = config_from_dict(config())
    boot = root_bootstrap(cfg, "a", admin_port=1)
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    a, b = clusters["cell-a"], clusters["cell-b"]
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"] for e in a["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [10010, 10011]
    # An HTTP check the leaf Envoy answers itself (a frozen Envoy still completes TCP handshakes).
    assert a["health_checks"][0]["http_health_check"] == {"path": LEAF_HEALTH_PATH} and a["outlier_detection"]["max_ejection_percent"] == 50
    assert "health_checks" not in b  # one leaf: as before
    routes = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    by_name = {r["name"]: r for r in routes["virtual_hosts"][0]["routes"]}
    assert "previous_hosts" in by_name["m-to-a"]["route"]["retry_policy"]["retry_host_predicate"][0]["name"]
    assert "retry_policy" not in by_name["m-to-b"]["route"]


def test_each_replicas_leaf_envoy_listens_on_its_address_and_feeds_its_agent() -> None:
    cfg = config_from_dict(config())
    boots = [leaf_bootstrap(cfg.leaf_replica("a", k), "a", admin_port=1, emulate_wan=False, access_log=True) for k in (0, 1)]
    ports = [b["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] for b in boots]
    assert ports == [10010, 10011]
    assert str(boots[0]).count("9010") and not str(boots[1]).count("9010")  # replica 1's access log is its own
    hcm = boots[0]["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    # The roots' check is answered first (no ext_proc, no token check) and is not in the access log.
    assert hcm["http_filters"][0]["typed_config"]["headers"][0]["string_match"] == {"exact": LEAF_HEALTH_PATH}
    assert hcm["access_log"][0]["filter"]["header_filter"]["header"]["invert_match"] is True


def test_roots_probe_every_replica_from_the_file_and_from_xds() -> None:
    cfg = config_from_dict(config())
    from_file = probe_targets(cfg.topology(), "a", config_probes(cfg), emulate_wan=False)
    assert [(t.name, t.address, t.replica) for t in from_file] == [("a", "127.0.0.1:9010", 0), ("a", "127.0.0.1:9011", 1),
                                                                   ("b", "127.0.0.1:9020", 0)]
    msg = topology(cfg)
    assert list(msg.cells[0].replica_probe_addresses) == ["127.0.0.1:9011"] and not msg.cells[1].replica_probe_addresses


def test_a_leaf_replica_has_a_snapshot_key_of_its_own_within_its_cell() -> None:
    def node(sub: str) -> base_pb2.Node:
        return base_pb2.Node(cluster="dlb-leaf", locality=base_pb2.Locality(zone="a", sub_zone=sub))

    assert dlb_node_key(node("")) == dlb_node_key(node("0")) == leaf_key("a")
    assert dlb_node_key(node("1")) == leaf_key("a", 1) == "dlb-leaf/a#1"


def test_the_probe_client_hands_on_one_merged_answer_per_cell() -> None:
    """What the root's routers get (``on_result``): cell a's two replicas as one answer under replica 0's
    target, None only once both have failed; cell b's answer as it came."""
    from dlb.core.leaf_replicas import ReplicaMerge
    from dlb.probe.client import ProbeClient, ProbeStats
    from dlb.proto import probe_pb2

    cfg = config_from_dict(config())
    targets = probe_targets(cfg.topology(), "a", config_probes(cfg), emulate_wan=False)
    got: list[tuple[str, int, probe_pb2.ProbeResponse | None]] = []
    client = ProbeClient(targets, lambda t, r, now: got.append((t.name, t.replica, r)))
    client.merges = {0: ReplicaMerge()}
    client.stats = {t.key: ProbeStats() for t in targets}

    def answer(t_index: int, rif: float, completed: int) -> None:
        t = targets[t_index]
        resp = probe_pb2.ProbeResponse(cell=t.name, rif=rif, replicas=1, completed=completed, healthy_replicas=1)
        st = client.stats[t.key]
        st.last, st.available = resp, True
        client._deliver(t, resp, 0.0)

    answer(0, 2.0, 10)
    answer(1, 3.0, 5)
    answer(2, 7.0, 1)
    assert [(n, k, r.rif if r else None) for n, k, r in got] == [("a", 0, 2.0), ("a", 0, 5.0), ("b", 0, 7.0)]
    assert got[1][2] is not None and got[1][2].completed == 15 and got[1][2].healthy_replicas == 1
    client.stats[targets[1].key].available = False
    client._deliver(targets[1], None, 1.0)
    assert got[-1][2] is not None and got[-1][2].rif == 2.0  # one replica failed: the cell is the other
    client.stats[targets[0].key].available = False
    client._deliver(targets[0], None, 1.0)
    assert got[-1] == ("a", 0, None)  # both failed: now the cell is unusable
    stats = client.cell_stats(0)
    assert stats is not None and stats.ok == 0 and not stats.available


def test_replicas_from_dns_need_a_name_and_are_expanded_per_address() -> None:
    import asyncio

    from dlb.probe import replica_dns

    raw = config({"replicas": "dns"})
    raw["cells"][0]["leaf"].update(address="leaf-a.example:10010", probe="leaf-a.example:9010")
    cfg = config_from_dict(raw)
    assert cfg.cell("a").leaf.replicas_dns and cfg.cell("a").leaf.replicated and topology(cfg).cells[0].replicas_dns
    assert any(p == "cells[0].leaf.replicas" and "IP address" in r for p, r in problems(config({"replicas": "dns"})))
    assert any(p == "cells[0].leaf.replicas" and "or dns" in r for p, r in problems(config({"replicas": "dsn"})))

    targets = probe_targets(cfg.topology(), "a", config_probes(cfg), emulate_wan=False)
    answers = {"leaf-a.example": ["10.0.0.9", "10.0.0.7"]}

    async def resolver(host: str, port: int) -> list[str]:
        if host not in answers:
            raise OSError("no such name")
        return answers[host]

    resolved = asyncio.run(replica_dns.resolve_targets(targets, resolver, {}))
    out = replica_dns.expand(targets, resolved)
    assert [(t.name, t.address, t.replica, t.tls_name) for t in out] == [
        ("a", "10.0.0.7:9010", 0, "leaf-a.example"), ("a", "10.0.0.9:9010", 1, "leaf-a.example"), ("b", "127.0.0.1:9020", 0, "")]
    del answers["leaf-a.example"]  # a DNS hiccup keeps the last addresses
    assert asyncio.run(replica_dns.resolve_targets(targets, resolver, resolved)) == resolved
    assert replica_dns.expand(targets, {}) == targets  # not resolved yet: probed by name, as one replica
