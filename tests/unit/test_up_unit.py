"""``dlb up --config FILE``: ready means routable, the URLs it prints work, and it stops in order.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/e2e/test_up.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlb.testbed.fleet import CellPlan, Fleet, demo_config


def _root_metrics(usable: dict[tuple[str, str], float], probes: dict[str, tuple[float, float, float]]) -> str:
    """A root's /metrics as prometheus_client writes it (counters end in ``_total``); probes: cell -> (ok, failed, age)."""
    lines = [f'dlb_root_cell_usable{{cell="{c}",endpoint="{ep}"}} {v}' for (ep, c), v in usable.items()]
    for c, (ok, failed, age) in probes.items():
        lines += [f'dlb_root_probe_age_seconds{{cell="{c}"}} {age}', f'dlb_root_probe_errors_total{{cell="{c}"}} {failed}',
                  f'dlb_root_probes_total{{cell="{c}"}} {ok}']
    return "\n".join(lines) + "\n"


def test_a_waiting_root_names_each_unusable_cell_and_why() -> None:
    from dlb.config import config_from_dict
    from dlb.launch.waiting import root_waiting

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test"),
                         CellPlan("europe-west1", 1, "fast-test")))
    cfg = config_from_dict(demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"], "europe-west1": ["127.0.0.1:3"]}))
    eps = [ep.name for ep in cfg.endpoints]
    every = {(ep, c): 1.0 for ep in eps for c in ("us-east1", "us-west1", "europe-west1")}
    fresh = dict.fromkeys(("us-east1", "us-west1", "europe-west1"), (50.0, 0.0, 0.01))
    healthy = "dlb_leaf_healthy_servers 1.0\ndlb_leaf_envoy_reachable 1.0\n"
    leaves: dict[str, str | None] = {"us-east1": healthy, "us-west1": healthy, "europe-west1": healthy}
    assert root_waiting(_root_metrics(every, fresh), cfg, "us-east1", leaves) == ""

    down = every | {(ep, "us-west1"): 0.0 for ep in eps}
    no_server = leaves | {"us-west1": "dlb_leaf_healthy_servers 0.0\ndlb_leaf_envoy_reachable 1.0\n"}
    assert root_waiting(_root_metrics(down, fresh), cfg, "us-east1", no_server) == (
        "usable cells — cell us-west1: a healthy server (its leaf reports 0 of 1 healthy: is 127.0.0.1:2 running?)")

    silent = fresh | {"us-west1": (0.0, 7.0, float("inf"))}
    probe = cfg.cell("us-west1").leaf.probe
    assert root_waiting(_root_metrics(down, silent), cfg, "us-east1", leaves | {"us-west1": None}) == (
        f"usable cells — cell us-west1: its leaf agent's first probe answer ({probe}, 7 failed)")

    no_envoy = leaves | {"us-west1": "dlb_leaf_healthy_servers 1.0\ndlb_leaf_envoy_reachable 0.0\n"}
    assert root_waiting(_root_metrics(down, silent), cfg, "us-east1", no_envoy) == (
        f"usable cells — cell us-west1: its leaf Envoy at {cfg.cell('us-west1').leaf.address} "
        "(its agent cannot reach it, so it refuses probes)")

    stale = fresh | {"us-west1": (50.0, 3.0, 4.2)}
    assert "cell us-west1: a fresh probe answer from its leaf agent" in root_waiting(_root_metrics(down, stale), cfg, "us-east1", leaves)
    assert "last answer 4s ago, 3 failed" in root_waiting(_root_metrics(down, stale), cfg, "us-east1", leaves)

    # The reason the metrics cannot give, from the root's log: a stranger's gie cell waited 90 s on "its metrics
    # to answer" while its /metrics answered (without GIE's pool gauges); the why was only in the log.
    from dlb.launch.waiting import last_probe_failures

    log = ('{"cell": "us-west1", "reason": "UNAVAILABLE", "event": "probe_failed"}\n{"event": "other"}\n'
           '{"cell": "us-west1", "reason": "exports no pool metrics", "event": "probe_failed"}\n{"cell": "us-we')
    assert last_probe_failures(log) == {"us-west1": "exports no pool metrics"}
    assert root_waiting(_root_metrics(down, silent), cfg, "us-east1", leaves | {"us-west1": None}, last_probe_failures(log)) == (
        f"usable cells — cell us-west1: its leaf agent's first probe answer ({probe}, 7 failed; last: exports no pool metrics)")

    one_endpoint = every | {(eps[-1], "europe-west1"): 0.0}  # one endpoint has not heard from one leaf yet
    assert root_waiting(_root_metrics(one_endpoint, fresh), cfg, "us-east1", leaves) == (
        f"usable cells — cell europe-west1 for {eps[-1]}: its leaf to report it available")


def test_after_its_grace_a_root_starts_without_a_cell_known_to_be_down_but_never_without_every_cell() -> None:
    """A root waited for every cell, so ``dlb up`` started during one cell's outage never became ready."""
    from dlb.config import config_from_dict
    from dlb.launch.waiting import blocking

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test"),
                         CellPlan("europe-west1", 1, "fast-test")))
    cfg = config_from_dict(demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"], "europe-west1": ["127.0.0.1:3"]}))
    eps = [ep.name for ep in cfg.endpoints]
    cells = ("us-east1", "us-west1", "europe-west1")
    every = {(ep, c): 1.0 for ep in eps for c in cells}
    fresh = dict.fromkeys(cells, (50.0, 0.0, 0.01))
    west_down = every | {(ep, "us-west1"): 0.0 for ep in eps}
    text = _root_metrics(west_down, fresh)
    assert blocking(text, cfg, "us-east1", skip_down=False) == ({"us-west1": eps}, [])
    assert blocking(text, cfg, "us-east1", skip_down=True) == ({}, ["us-west1"])
    # A cell not heard from (no answer yet, or a stale one) may be a start-up race: it still blocks.
    for silent in ((0.0, 7.0, float("inf")), (50.0, 3.0, 4.2)):
        assert blocking(_root_metrics(west_down, fresh | {"us-west1": silent}), cfg, "us-east1", skip_down=True) == (
            {"us-west1": eps}, [])
    # An endpoint with no usable cell at all: not ready, whatever is known.
    all_down = {(ep, c): 0.0 for ep in eps for c in cells}
    assert blocking(_root_metrics(all_down, fresh), cfg, "us-east1", skip_down=True)[0] == dict.fromkeys(cells, eps)
    one_endpoint = every | {(eps[0], c): 0.0 for c in cells}
    assert blocking(_root_metrics(one_endpoint, fresh), cfg, "us-east1", skip_down=True) == (
        {c: [eps[0]] for c in cells}, [])


def test_a_cell_a_root_started_without_is_said_to_join_once_usable_for_every_endpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console said a root started without a cell and that it would join; nothing said when it did (a
    stranger waited for it). It is said once, when the cell is usable for every endpoint, not before."""
    import io

    from dlb.config import config_from_dict
    from dlb.launch import up
    from dlb.launch.supervisor import Supervisor

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    cfg = config_from_dict(demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]}))
    eps = [ep.name for ep in cfg.endpoints]
    fresh = dict.fromkeys(("us-east1", "us-west1"), (50.0, 0.0, 0.01))
    usable = {(ep, "us-east1"): 1.0 for ep in eps} | {(ep, "us-west1"): 0.0 for ep in eps}
    monkeypatch.setattr(up, "http_get", lambda url, timeout=1.0: (200, _root_metrics(usable, fresh)))
    console = io.StringIO()
    sup = Supervisor(tmp_path / "logs", console=console)
    dep = up.Deployment(cfg=cfg, config_path="x", supervisor=sup, status_url="http://127.0.0.1:1")
    dep.roots["us-east1"] = up.RootInfo("us-east1", "", "", "http://127.0.0.1:9/metrics", tmp_path / "r.json")
    dep.started_without["us-east1"] = {"us-west1"}
    dep.report_joined()
    usable[(eps[0], "us-west1")] = 1.0  # one endpoint only: not yet
    dep.report_joined()
    assert "joined" not in console.getvalue()
    usable.update({(ep, "us-west1"): 1.0 for ep in eps})
    dep.report_joined()
    dep.report_joined()
    assert console.getvalue().count("cell us-west1 joined: usable for every endpoint") == 1


def test_up_never_draws_a_port_its_config_names_for_an_admin_or_metrics_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config may come from another process's free_port() (a test, a script): its ports are free
    until ``dlb up`` starts the services, so a draw could otherwise land on one and two children collide."""
    from dlb import procutil
    from dlb.config import config_from_dict
    from dlb.launch.supervisor import Supervisor
    from dlb.launch.up import listen_addresses, plan

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    raw = demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]})
    cfg = config_from_dict(raw)
    named = sorted({hp.port for _, hp in listen_addresses(cfg)})
    monkeypatch.setattr(procutil, "_handed_out", set())  # as in a fresh `dlb up` process
    draws = iter(named + list(range(procutil.LOWEST_PORT, procutil.LOWEST_PORT + 2000)))  # the config's ports first
    monkeypatch.setattr(procutil._random, "randrange", lambda a, b: next(draws))
    monkeypatch.setattr(procutil, "_pool_top", lambda ephemeral=None: procutil.LOWEST_PORT + 2000)
    dep = plan(cfg, str(tmp_path / "dlb.yaml"), Supervisor(tmp_path / "run"), root_envoys=2, control_planes=2)
    more = dep.more_root_admin["us-east1"]
    # Both control planes' /status are printed: each lists only the nodes streaming from it.
    second_cp = dep.control_planes[1][1]
    assert f"control plane 2: http://{second_cp}/status" in dep.urls_text(), dep.urls_text()
    urls = [*dep.leaf_metrics.values(), *dep.leaf_admin.values(), *more]
    drawn = {int(re.search(r":(\d+)/", u).group(1)) for u in urls}  # type: ignore[union-attr]
    assert len(drawn) == len(urls) and not drawn & set(named), (drawn, named)
    # The second root Envoy's admin is listed with the rest, so an operator can find and scrape it.
    second = more[0].rsplit("//", 1)[1].rstrip("/")
    assert f"{second}  root us-east1 Envoy 2 admin (drawn)" in dep.ports_text() and second in dep.urls_text()
    # A root's metrics and admin are the config's (services.root.*), not drawn: a stable Prometheus target.
    root = dep.roots["us-east1"]
    assert (root.metrics_url, root.admin_url) == (f"http://{cfg.services.root.metrics}/metrics", f"http://{cfg.services.root.admin}/")


def test_each_root_gets_its_own_metrics_and_admin_port_from_the_config() -> None:
    from dlb.config import config_from_dict
    from dlb.launch.up import listen_addresses, root_ports

    def cell(name: str, i: int, root: bool) -> dict[str, object]:
        return {"name": name, "servers": [f"127.0.0.1:{100 + i}"], "leaf": {"address": f"127.0.0.1:{200 + i}", "probe": f"127.0.0.1:{300 + i}"},
                **({"root": {"address": f"127.0.0.1:{400 + i}"}} if root else {})}

    cfg = config_from_dict({"version": 1, "endpoints": [{"name": "c", "match": {"prefix": "/v1/"}}],
                            "cells": [cell("a", 0, True), cell("b", 1, False), cell("c", 2, True)],
                            "network": {"default_one_way_ms": 1}, "services": {"root": {"metrics": "127.0.0.1:29080"}}})
    assert {c: (str(m), str(a)) for c, (m, a) in root_ports(cfg).items()} == {
        "a": ("127.0.0.1:29080", "127.0.0.1:19901"), "c": ("127.0.0.1:29081", "127.0.0.1:19902")}
    fields = dict(listen_addresses(cfg))
    assert str(fields["services.root.metrics + 1 (root c)"]) == "127.0.0.1:29081" and "services.root.admin (root a Envoy)" in fields


def test_up_starts_every_leaf_replica_with_its_own_agent_envoy_and_snapshot(tmp_path: Path) -> None:
    """A cell with ``leaf.replicas``: one agent (``--replica k``) and one leaf Envoy per replica; replica k's
    Envoy asks the control plane for its own snapshot (``locality.sub_zone`` k), listed with its ports."""
    import json

    from dlb.config import config_from_dict
    from dlb.launch.supervisor import Supervisor
    from dlb.launch.up import listen_addresses, plan

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    raw = demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]})
    raw["cells"][1]["leaf"]["replicas"] = [{"address": "127.0.0.1:47001", "probe": "127.0.0.1:47002"}]
    cfg = config_from_dict(raw)
    dep = plan(cfg, str(tmp_path / "dlb.yaml"), Supervisor(tmp_path / "run"))
    agents = {c.name: c.argv for c in dep.supervisor.children if c.name.startswith("leaf us-west1") and c.name.endswith("agent")}
    assert sorted(agents) == ["leaf us-west1 agent", "leaf us-west1 replica 1 agent"]
    assert agents["leaf us-west1 replica 1 agent"][agents["leaf us-west1 replica 1 agent"].index("--replica") + 1] == "1"
    boot = json.loads((tmp_path / "run" / "leaf-us-west1-envoy-2.bootstrap.json").read_text())
    assert boot["node"]["locality"] == {"zone": "us-west1", "sub_zone": "1"}
    assert ("cells[1].leaf.replicas[0].probe", cfg.cell("us-west1").leaf.replicas[0].probe) in listen_addresses(cfg)
    assert "leaf us-west1 replica 1: metrics" in dep.urls_text()


def test_a_cell_served_by_an_inference_pool_gets_no_dlb_leaf(tmp_path: Path) -> None:
    """``cells[].inference_pool``: its GIE gateway and ``dlb serve epp`` serve it, so ``dlb up`` starts no leaf
    agent or Envoy there and checks none of its addresses, the control plane keeps no leaf snapshot for it,
    and rendering its leaf Envoy is refused naming the field; the roots still route to it."""
    from dlb.config import config_from_dict
    from dlb.control_plane.service import ControlPlane, leaf_key
    from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap
    from dlb.launch.supervisor import Supervisor
    from dlb.launch.up import listen_addresses, plan

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    raw = demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]})
    pool = raw["cells"][1]
    del pool["servers"]
    pool["inference_pool"] = {"name": "vllm-llama3-8b-instruct"}
    cfg = config_from_dict(raw)
    dep = plan(cfg, str(tmp_path / "dlb.yaml"), Supervisor(tmp_path / "run"))
    assert not [c.name for c in dep.supervisor.children if c.name.startswith("leaf us-west1")]
    assert [c.name for c in dep.supervisor.children if c.name.startswith("leaf us-east1")]
    assert not [f for f, _ in listen_addresses(cfg) if f.startswith("cells[1].leaf")]
    with pytest.raises(ValueError, match=r"cells\[1\] \(us-west1\) has no DLB leaf Envoy \(inference_pool"):
        leaf_bootstrap(cfg, "us-west1", admin_port=9901, emulate_wan=False)
    assert "cell-us-west1" in json.dumps(root_bootstrap(cfg, "us-east1", admin_port=9901))
    assert set(ControlPlane(cfg)._static.leaf) == {leaf_key("us-east1")}


def test_up_starts_no_root_service_when_every_endpoint_runs_natively(tmp_path: Path) -> None:
    """Every endpoint native-discrete without affinity: no root Envoy carries an ext_proc, so ``dlb up``
    starts no root service (it would only probe the leaves the control plane already probes), checks
    none of its ports, and says so on the console; a reload that needs one back is refused by name.
    One endpoint on the ext_proc (affinity keeps it): the services start."""
    from dlb.config import config_from_dict
    from dlb.launch.supervisor import Supervisor
    from dlb.launch.up import listen_addresses, plan, process_changes

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    raw = demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]})
    with_ext_proc = config_from_dict(raw)
    for ep in raw["endpoints"]:
        ep["policy"] = {"plugins": [{"type": "native-discrete", "parameters": {"cost": "latency"}}]}
    native = config_from_dict(raw)
    dep = plan(native, str(tmp_path / "dlb.yaml"), Supervisor(tmp_path / "run"))
    names = [c.name for c in dep.supervisor.children]
    assert "root us-east1 service" not in names and "root us-east1 envoy" in names, names
    assert not [f for f, _ in listen_addresses(native) if f.endswith("root.ext_proc") or f.startswith("services.root.metrics")]
    assert "root us-east1: base_url http://" in dep.urls_text() and "metrics none  admin" in dep.urls_text()
    assert "the root services would start (an endpoint now decides on the root's ext_proc)" in process_changes(
        native, with_ext_proc), process_changes(native, with_ext_proc)
    assert [c for c in process_changes(with_ext_proc, native) if c.startswith("the root services would stop")], (
        process_changes(with_ext_proc, native))
    dep = plan(with_ext_proc, str(tmp_path / "dlb2.yaml"), Supervisor(tmp_path / "run2"))
    assert "root us-east1 service" in [c.name for c in dep.supervisor.children]


def test_a_reload_that_needs_other_processes_is_named_not_half_applied() -> None:
    """What ``dlb up``'s SIGHUP refuses: a cell added or removed, a leaf bound elsewhere, a source cell's
    root, the shared services. What it passes on: what the control planes apply live (servers, policy)."""
    import copy

    from test_config import minimal

    from dlb.config import config_from_dict
    from dlb.launch.up import process_changes

    base = minimal()
    base["cells"][0]["root"] = {"address": "127.0.0.1:10000"}
    running = config_from_dict(base)
    assert process_changes(running, config_from_dict(copy.deepcopy(base))) == []
    live = copy.deepcopy(base)
    live["cells"][1]["servers"].append("127.0.0.1:8022")
    live["endpoints"][0]["policy"] = {"mechanism": "discrete", "cost": "latency"}
    assert process_changes(running, config_from_dict(live)) == []
    grown = copy.deepcopy(base)
    grown["cells"].append({"name": "c", "leaf": {"address": "127.0.0.1:10030", "probe": "127.0.0.1:9030"},
                           "servers": ["127.0.0.1:8030"]})
    grown["network"]["default_one_way_ms"] = 20
    assert process_changes(running, config_from_dict(grown)) == ["leaf c added"]
    assert process_changes(config_from_dict(grown), running) == ["leaf c removed"]
    moved = copy.deepcopy(base)
    moved["cells"][1]["leaf"]["probe"] = "127.0.0.1:9021"
    moved["cells"][0]["root"]["address"] = "127.0.0.1:10001"
    assert process_changes(running, config_from_dict(moved)) == ["root a changed", "leaf b changed"]
    rebound = copy.deepcopy(base)
    rebound["services"] = {"control_plane": {"status": "127.0.0.1:18101"}}
    assert process_changes(running, config_from_dict(rebound)) == ["services.control_plane.status changed"]
    # Read by the root services and Envoys only at start: reported reloaded, a stranger saw running roots keep
    # the old probe period while restarted ones took the new.
    timed = copy.deepcopy(base)
    timed["probe"] = {"period_ms": 200}
    assert process_changes(running, config_from_dict(timed)) == ["probe.period_ms changed"]


def test_a_reload_the_loader_cannot_read_is_refused_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything the loader raises refuses the SIGHUP: before, only a ConfigError did, and anything else (a
    RecursionError from an alias cycle) reached dlb up's start-up handler, which stopped every process."""
    from test_config import minimal

    from dlb.config import config_from_dict
    from dlb.launch import up

    path = tmp_path / "dlb.yaml"
    path.write_text(json.dumps(minimal()))
    running = config_from_dict(minimal())
    assert not isinstance(up.reload_check(str(path), {}, running), str)

    def broken(text: str, source: str, env: dict[str, str]) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(up, "load_with_env", broken)
    why = up.reload_check(str(path), {}, running)
    assert isinstance(why, str) and "RecursionError" in why and str(path) in why, why


def test_up_refuses_two_of_its_listeners_on_one_address_naming_both_fields() -> None:
    """A root service's metrics port on a leaf's probe address: the second could never bind, or its
    readiness check would reach the first. Named before anything starts."""
    from dlb.config import config_from_dict
    from dlb.launch.up import shared_listeners

    raw = {"version": 1, "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
           "cells": [{"name": "a", "servers": ["127.0.0.1:1"], "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:18391"},
                      "root": {"address": "127.0.0.1:4"}}],
           "services": {"root": {"metrics": "127.0.0.1:18391"}}}
    problems = shared_listeners(config_from_dict(raw))
    assert problems == ["services.root.metrics (root a): address 127.0.0.1:18391 is also used by cells[0].leaf.probe"], problems


def test_up_sees_a_wildcard_bind_and_a_tcp_access_log_clash_and_validate_warns(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Two clashes a stranger got past dlb up (each child then died on a bind error naming no field): a leaf
    Envoy on 0.0.0.0:P beside another cell's 127.0.0.1:P, and a leaf's access_log on its own probe address.
    ``dlb config validate`` said "valid" to these and to the ones dlb up refused: it now warns of each."""
    from test_config import minimal

    from dlb.cli import main
    from dlb.config import config_from_dict
    from dlb.launch.up import shared_listeners

    wild = minimal()
    wild["cells"][1]["leaf"]["listen"] = "0.0.0.0:9010"  # cell a's probe is 127.0.0.1:9010
    assert shared_listeners(config_from_dict(wild)) == [
        "cells[1].leaf.listen: address 0.0.0.0:9010 is also used by cells[0].leaf.probe (127.0.0.1:9010)"]
    als = minimal()
    als["cells"][1]["leaf"]["access_log"] = "127.0.0.1:9020"  # its own probe
    assert shared_listeners(config_from_dict(als)) == ["cells[1].leaf.access_log: address 127.0.0.1:9020 is also used by cells[1].leaf.probe"]
    two_roots = minimal()
    for i, cell in enumerate(two_roots["cells"]):
        cell["root"] = {"address": f"127.0.0.1:{10100 + i}"}
    assert "services.root.ext_proc (root b): address 127.0.0.1:18080 is also used by services.root.ext_proc (root a)" in (
        shared_listeners(config_from_dict(two_roots)))
    path = tmp_path / "dlb.yaml"
    path.write_text(json.dumps(als))
    assert main(["config", "validate", str(path)]) == 0
    assert "warning: on one host (dlb up) two listeners clash: cells[1].leaf.access_log" in capsys.readouterr().err
    # A leaf reached at a pod address binds 0.0.0.0 on the same port: one listener, no clash; but without tls
    # its probe port is plaintext beyond loopback, which validate says.
    pod = minimal()
    pod["cells"][0]["leaf"] = {"address": "10.0.0.5:10010", "probe": "10.0.0.5:9010"}
    assert shared_listeners(config_from_dict(pod)) == []
    path.write_text(json.dumps(pod))
    assert main(["config", "validate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "no tls section, and cells[0].leaf.probe listen(s) beyond loopback in plaintext" in err and "clash" not in err, err


def test_a_restarted_roots_readiness_follows_the_reloaded_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a SIGHUP changed ``network.allowed``, a restarted root was 'not ready' forever, waiting for a cell
    it no longer uses: readiness was judged by the config ``dlb up`` started with."""
    from test_config import minimal

    from dlb.config import config_from_dict
    from dlb.launch import up
    from dlb.launch.supervisor import Supervisor

    base = minimal()
    base["cells"][0]["root"] = {"address": "127.0.0.1:10000"}
    started, reloaded = config_from_dict(base), config_from_dict(minimal() | {"cells": base["cells"]})
    dep = up.Deployment(cfg=started, config_path="x.yaml", supervisor=Supervisor(tmp_path), status_url="")
    judged: list[object] = []
    from dlb.launch import waiting

    monkeypatch.setattr(up, "http_get", lambda url, timeout=1.0: (200, ""))  # a socket
    monkeypatch.setattr(waiting, "blocking", lambda text, cfg, cell, skip_down: judged.append(cfg) or ({}, []))
    ready = tmp_path / "ready.json"
    ready.write_text("{}")
    dep.cfg = reloaded
    assert up._root_ready(ready, "http://127.0.0.1:1/metrics", dep, "a")
    assert judged == [reloaded]
