"""``dlb config check-envoy``: a hand-edited Envoy file is checked against the DLB config, every mismatch with a path.

In-process (no Envoy binary): the shipped templates and every rendered bootstrap agree with their DLB
config, and each mistake an operator can make by hand is reported where it is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlb.cli import main
from dlb.config import load_config
from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap
from dlb.envoy.check import check_bootstrap

CONFIG_DIR = Path(__file__).resolve().parents[2] / "envoy_configs"
EXAMPLE = CONFIG_DIR / "dlb.example.yaml"
CFG = load_config(EXAMPLE)
ROOT = yaml.safe_load((CONFIG_DIR / "root.yaml").read_text())
LEAF = yaml.safe_load((CONFIG_DIR / "leaf.yaml").read_text())
HCM = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config"


def test_shipped_templates_agree_with_their_dlb_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check-envoy", str(CONFIG_DIR / "root.yaml"), str(CONFIG_DIR / "leaf.yaml"), "--config", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.count("agrees with") == 2


@pytest.mark.parametrize("cell", CFG.cell_names)
def test_every_rendered_bootstrap_agrees(cell: str) -> None:
    assert check_bootstrap(root_bootstrap(CFG, cell, admin_port=9901), CFG) == []
    assert check_bootstrap(root_bootstrap(CFG, cell, admin_port=9901, ready_port=9902), CFG) == []
    assert check_bootstrap(root_bootstrap(CFG, cell, admin_port=9901, native_flow=True), CFG) == []  # aggregates in the weights
    assert check_bootstrap(leaf_bootstrap(CFG, cell, admin_port=9901, emulate_wan=True, access_log=True), CFG) == []


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    return boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def _routes(boot: dict[str, Any]) -> list[dict[str, Any]]:
    return _hcm(boot)["route_config"]["virtual_hosts"][0]["routes"]


def _cluster(boot: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in boot["static_resources"]["clusters"] if c["name"] == name)


def _drop_cluster(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(b: dict[str, Any]) -> None:
        b["static_resources"]["clusters"] = [c for c in b["static_resources"]["clusters"] if c["name"] != name]
    return edit


def _set(getter: Callable[[dict[str, Any]], Any], key: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(b: dict[str, Any]) -> None:
        getter(b)[key] = value
    return edit


def _endpoint_address(name: str, port: int) -> Callable[[dict[str, Any]], None]:
    def edit(b: dict[str, Any]) -> None:
        _cluster(b, name)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"] = port
    return edit


def _ext_proc(b: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in _hcm(b)["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")


def _drop_route(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(b: dict[str, Any]) -> None:
        b_routes = _routes(b)
        b_routes[:] = [r for r in b_routes if r["name"] != name]
    return edit


def _cluster_header(b: dict[str, Any]) -> None:
    r = next(r for r in _routes(b) if r["name"] == "llama-8b-to-us-west1")
    r["route"] = {"cluster_header": "x-dlb-cell"}


def _fallback_first(b: dict[str, Any]) -> None:
    routes = _routes(b)
    i = next(k for k, r in enumerate(routes) if r["name"] == "llama-8b-fallback")
    routes.insert(0, routes.pop(i))


def _filters_reversed(b: dict[str, Any]) -> None:
    _hcm(b)["http_filters"].reverse()


def _wrong_src_cell(b: dict[str, Any]) -> None:
    _hcm(b)["route_config"]["request_headers_to_add"][0]["header"]["value"] = "us-west1"


ROOT_MISTAKES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("missing cell cluster", _drop_cluster("cell-us-west1"), "static_resources.clusters", "no cluster 'cell-us-west1'"),
    ("cluster to the wrong leaf", _endpoint_address("cell-us-west1", 10099), "static_resources.clusters[2].load_assignment",
     "cells[1].leaf.address is 127.0.0.1:10020"),
    ("cluster of no cell", lambda b: b["static_resources"]["clusters"].append(dict(_cluster(b, "cell-us-west1"), name="cell-mars")),
     "static_resources.clusters[4]", "no such cell"),
    ("ext_proc at another service", _endpoint_address("dlb_root_ext_proc", 18099), "static_resources.clusters[0].load_assignment",
     "root.ext_proc is 127.0.0.1:18080"),
    ("ext_proc to an unknown cluster", lambda b: _ext_proc(b)["typed_config"]["grpc_service"]["envoy_grpc"].update(cluster_name="x"),
     f"{HCM}.http_filters[0].typed_config.grpc_service.envoy_grpc.cluster_name", "not in static_resources.clusters"),
    ("ext_proc fails closed", lambda b: _ext_proc(b)["typed_config"].update(failure_mode_allow=False),
     f"{HCM}.http_filters[0].typed_config.failure_mode_allow", "fails open"),
    ("ext_proc after the router", _filters_reversed, f"{HCM}.http_filters[2]", "never runs"),
    ("token in the route config", lambda b: _hcm(b)["route_config"]["request_headers_to_add"].append(
        {"header": {"key": "x-dlb-root-token", "value": "derived-x"}}), f"{HCM}.route_config.request_headers_to_add", "xDS would carry"),
    ("no token injector", lambda b: _hcm(b)["http_filters"].pop(1), f"{HCM}.http_filters", "no envoy.filters.http.credential_injector"),
    ("no token secret", lambda b: b["static_resources"].pop("secrets"), "static_resources.secrets", "no 'dlb-root-token' secret"),
    ("no ext_proc filter", lambda b: _hcm(b).update(http_filters=_hcm(b)["http_filters"][1:]), f"{HCM}.http_filters",
     "is never asked"),
    ("x-dlb-cell not internal", _set(lambda b: _hcm(b)["route_config"], "internal_only_headers", ["x-dlb-src-cell"]),
     f"{HCM}.route_config.internal_only_headers", "missing x-dlb-cell"),
    ("internal peers", lambda b: _hcm(b).pop("internal_address_config"), f"{HCM}.internal_address_config", "internal"),
    ("missing per-cell route", _drop_route("embed-to-eu-west1"), f"{HCM}.route_config.virtual_hosts",
     "no route matching x-dlb-cell = cell-eu-west1"),
    ("missing fail-open route", _drop_route("embed-fallback"), f"{HCM}.route_config.virtual_hosts", "no fail-open route"),
    ("cluster_header routing", _cluster_header, f"{HCM}.route_config.virtual_hosts[0].routes[1].route.cluster_header",
     "503"),
    ("fail-open first", _fallback_first, f"{HCM}.route_config.virtual_hosts[0].routes[0]", "picks never apply"),
    ("fallback to a forbidden cell", lambda b: next(r for r in _routes(b) if r["name"] == "embed-fallback")["route"]
     ["weighted_clusters"]["clusters"].append({"name": "cell-mars", "weight": 1}),
     f"{HCM}.route_config.virtual_hosts[0].routes[7].route.weighted_clusters.clusters[3]", "not a cell this root may send to"),
    ("native fallback to a forbidden cell", lambda b: next(r for r in _routes(b) if r["name"] == "embed-fallback")["route"]
     ["weighted_clusters"]["clusters"].append({"name": "cell-us-east1.or.mars", "weight": 1}),
     f"{HCM}.route_config.virtual_hosts[0].routes[7].route.weighted_clusters.clusters[3]", "not a cell this root may send to"),
    ("listener port", _set(lambda b: b["static_resources"]["listeners"][0]["address"]["socket_address"], "port_value", 10009),
     "static_resources.listeners[0].address.socket_address.port_value", "127.0.0.1:10000"),
    ("src cell", _wrong_src_cell, f"{HCM}.route_config.request_headers_to_add", "x-dlb-src-cell: us-east1"),
    ("unknown cell", _set(lambda b: b["node"]["locality"], "zone", "mars"), "node.locality.zone", "not a cell"),
    ("unknown role", _set(lambda b: b["node"], "cluster", "gateway"), "node.cluster", "cannot tell root from leaf"),
]


@pytest.mark.parametrize(("edit", "path", "reason"), [m[1:] for m in ROOT_MISTAKES], ids=[m[0] for m in ROOT_MISTAKES])
def test_each_root_mistake_is_reported_where_it_is(edit: Callable[[dict[str, Any]], None], path: str, reason: str) -> None:
    boot = copy.deepcopy(ROOT)
    edit(boot)
    found = check_bootstrap(boot, CFG)
    assert any(m.path == path and reason in m.reason for m in found), "\n".join(map(str, found))


LEAF_MISTAKES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("a server missing", lambda b: _cluster(b, "servers")["load_assignment"]["endpoints"][0]["lb_endpoints"].pop(),
     "static_resources.clusters[0].load_assignment", "cells[0].servers"),
    ("no servers cluster", _drop_cluster("servers"), "static_resources.clusters", "no cluster 'servers'"),
    ("x-dlb-server not internal", _set(lambda b: _hcm(b)["route_config"], "internal_only_headers", ["x-dlb-cell"]),
     f"{HCM}.route_config.internal_only_headers", "missing x-dlb-server"),
    ("no route for the API prefix", lambda b: [r["match"].update(prefix="/v2/") for r in _routes(b)], f"{HCM}.route_config.virtual_hosts",
     "no route for prefix /v1/"),
    ("leaf port", _set(lambda b: b["static_resources"]["listeners"][0]["address"]["socket_address"], "port_value", 10011),
     "static_resources.listeners[0].address.socket_address.port_value", "127.0.0.1:10010"),
    ("leaf ext_proc elsewhere", _endpoint_address("dlb_leaf_ext_proc", 9099), "static_resources.clusters[2].load_assignment",
     "leaf.ext_proc is 127.0.0.1:9011"),
    # A stranger's rendered leaf without it: the agent never saw a request end, and the cell's RIF grew for 15 min.
    ("no access log to the agent", lambda b: _hcm(b).pop("access_log"), f"{HCM}.access_log", "requests in flight only grow"),
]


@pytest.mark.parametrize(("edit", "path", "reason"), [m[1:] for m in LEAF_MISTAKES], ids=[m[0] for m in LEAF_MISTAKES])
def test_each_leaf_mistake_is_reported_where_it_is(edit: Callable[[dict[str, Any]], None], path: str, reason: str) -> None:
    boot = copy.deepcopy(LEAF)
    edit(boot)
    found = check_bootstrap(boot, CFG)
    assert any(m.path == path and reason in m.reason for m in found), "\n".join(map(str, found))


def test_a_leaf_ext_proc_the_config_does_not_have_is_reported() -> None:
    found = check_bootstrap(LEAF, CFG, cell="us-west1")  # us-west1's leaf has no ext_proc in the DLB config
    assert any("sets no cells[1].leaf.ext_proc" in m.reason for m in found)


def test_cli_exits_1_and_prints_every_mismatch_with_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    boot = copy.deepcopy(ROOT)
    _drop_cluster("cell-eu-west1")(boot)
    _set(lambda b: _hcm(b)["route_config"], "internal_only_headers", [])(boot)
    path = tmp_path / "root.yaml"
    path.write_text(yaml.safe_dump(boot))
    assert main(["config", "check-envoy", str(path), "--config", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: static_resources.clusters: no cluster 'cell-eu-west1'" in err
    assert f"{path}: {HCM}.route_config.internal_only_headers: missing x-dlb-cell" in err
    assert f"{path}: 2 mismatches with {EXAMPLE}" in err


def test_a_bad_cell_option_is_blamed_on_the_option_not_the_file() -> None:
    """``--cell nope`` is the caller's mistake: the report names ``--cell``, not the file's node.locality.zone."""
    boot = yaml.safe_load((CONFIG_DIR / "root.yaml").read_text())
    found = check_bootstrap(boot, CFG, cell="nope")
    assert [m.path for m in found] == ["--cell"] and "'nope' is not a cell" in str(found[0])


def _example_with(edit: Callable[[dict[str, Any]], None]) -> Any:
    from dlb.config.loader import config_from_dict

    raw = yaml.safe_load(EXAMPLE.read_text())
    edit(raw)
    return config_from_dict(raw, str(EXAMPLE))


def _flow_only(raw: dict[str, Any]) -> None:
    raw["endpoints"] = [ep for ep in raw["endpoints"] if ep["name"] == "embed"]


def test_a_root_whose_every_endpoint_runs_natively_needs_no_ext_proc_filter() -> None:
    """Rendered with --native-flow, an all-flow root has no filter (it would cost every request a lookup)."""
    cfg = _example_with(_flow_only)
    native = root_bootstrap(cfg, "us-east1", admin_port=9901, native_flow=True)
    assert not any(f["name"] == "envoy.filters.http.ext_proc" for f in _hcm(native)["http_filters"])
    assert check_bootstrap(native, cfg) == []
    assert check_bootstrap(root_bootstrap(cfg, "us-east1", admin_port=9901), cfg) == []
    # The example's chat endpoint takes the ext_proc on every root: there a missing filter is still a mistake.
    bare = copy.deepcopy(root_bootstrap(CFG, "us-east1", admin_port=9901))
    _hcm(bare)["http_filters"] = [f for f in _hcm(bare)["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
    assert any("no envoy.filters.http.ext_proc filter" in m.reason for m in check_bootstrap(bare, CFG))


@pytest.mark.parametrize("baseline", ["lr-global", "locality-failover", "hub-score"])
def test_an_operator_baseline_root_agrees_and_an_ext_proc_filter_in_it_is_reported(baseline: str) -> None:
    def operator(raw: dict[str, Any]) -> None:
        raw.setdefault("policy", {"apiVersion": "dlb.v1"}).setdefault("plugins", []).append({"type": baseline})
    cfg = _example_with(operator)
    boot = root_bootstrap(cfg, "us-east1", admin_port=9901)
    assert check_bootstrap(boot, cfg) == []
    with_filter = copy.deepcopy(boot)
    dlb_filter = next(f for f in _hcm(root_bootstrap(CFG, "us-east1", admin_port=9901))["http_filters"]
                      if f["name"] == "envoy.filters.http.ext_proc")
    _hcm(with_filter)["http_filters"].insert(0, dlb_filter)
    assert any(m.path.endswith("http_filters[0]") and "operator baseline" in m.reason for m in check_bootstrap(with_filter, cfg))


def test_render_refuses_what_envoy_would_and_binds_localhost_to_loopback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's render wrote --admin-port 99999 or -5 (Envoy refused the file), admin on the leaf's own
    listener port, and bound ``--listen localhost:P`` (or any name) on every interface."""
    out = tmp_path / "leaf.yaml"
    render = ["config", "render", str(EXAMPLE), "leaf", "us-east1", "-o", str(out)]
    for bad in ("99999", "-5", "0"):
        with pytest.raises(SystemExit) as exited:
            main([*render, "--admin-port", bad])
        assert exited.value.code == 2 and "1..65535" in capsys.readouterr().err
    assert main([*render, "--admin-port", "10010"]) == 2  # the example's us-east1 leaf listens on 10010
    assert "also the port of this Envoy's dlb_leaf listener" in capsys.readouterr().err and not out.exists()
    assert main([*render, "--admin-port", "9901", "--listen", "example.com:18100"]) == 2
    assert "is not an IP address" in capsys.readouterr().err and not out.exists()
    assert main([*render, "--admin-port", "9901", "--listen", "localhost:18100"]) == 0
    listener = next(lst for lst in yaml.safe_load(out.read_text())["static_resources"]["listeners"] if lst["name"] == "dlb_leaf")
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18100}, listener["address"]


def test_a_ready_port_on_the_admin_port_is_refused_by_render_and_reported_by_check_envoy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `render … leaf --admin-port 9902` met the ready port's default (9902): render, check-envoy and
    validate all passed, and Envoy refused to start ('address already in use')."""
    from dlb.envoy.bootstrap import leaf_bootstrap

    out = tmp_path / "leaf.yaml"
    assert main(["config", "render", str(EXAMPLE), "leaf", "us-east1", "--admin-port", "9902", "-o", str(out)]) == 2
    assert "--ready-port 9902 is also the admin port" in capsys.readouterr().err and not out.exists()
    assert main(["config", "xds-bootstrap", "--role", "leaf", "--cell", "us-east1", "--xds", "127.0.0.1:18000",
                 "--admin-port", "9902", "-o", str(out)]) != 0
    boot = leaf_bootstrap(CFG, "us-east1", admin_port=9902, emulate_wan=True, ready_port=9902)
    found = check_bootstrap(boot, CFG)
    assert any("also admin.address's port" in m.reason for m in found), found
