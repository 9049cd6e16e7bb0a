"""What running DLB on several hosts (Kubernetes pods) needs from the code (issue 17, part A).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/e2e/test_deploy_code.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_deploy_code import HEADLESS, _config, _cp_config, _discovery_config, _leaf_config

from dlb.cli import main
from dlb.config import ConfigError, HostPort, config_from_dict
from dlb.config.discovery import expand
from dlb.control_plane.service import ControlPlane
from dlb.envoy.drain import active_requests
from dlb.ext_proc.leaf_setup import state_from_config
from dlb.procutil import free_port

# --------------------------------------------------------------------------------------------
# 2. listen vs address
# --------------------------------------------------------------------------------------------


def test_a_loopback_address_stays_on_loopback() -> None:
    """Only this host can use a loopback address: binding every interface would just expose the leaf."""
    cfg = config_from_dict(_config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                                   root={"address": f"[::1]:{free_port()}"}))
    assert cfg.cell("a").leaf.bind == cfg.cell("a").leaf.address
    assert cfg.cell("a").root.bind == cfg.cell("a").root.address
    # ``localhost`` means this host too (a stranger's leaf.address localhost:P bound 0.0.0.0:P).
    cfg = config_from_dict(_config({"address": "localhost:19000", "probe": "127.0.0.1:19001"}, root={"address": "LocalHost:19100"}))
    assert (cfg.cell("a").leaf.bind, cfg.cell("a").root.bind) == (HostPort("127.0.0.1", 19000), HostPort("127.0.0.1", 19100))


def test_listen_must_be_an_ip_and_root_listen_needs_an_address() -> None:
    data = _config({"address": "127.0.0.1:9000", "probe": "127.0.0.1:9001", "listen": "my-pod:9000"},
                   root={"listen": "0.0.0.0:9100"})
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    paths = {p.path: p.reason for p in e.value.problems}
    assert "not an IP address" in paths["cells[0].leaf.listen"]
    assert "needs root.address" in paths["cells[0].root.listen"]


# --------------------------------------------------------------------------------------------
# 3 + 5. the leaf agent checks its own Envoy; /healthz and /readyz on the services' HTTP listeners
# --------------------------------------------------------------------------------------------


def test_leaf_refuses_a_bad_envoy_check_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _leaf_config(tmp_path, f"127.0.0.1:{free_port()}")
    assert main(["serve", "leaf", "--config", str(path), "--cell", "a", "--envoy-check-address", "nope"]) == 1
    assert "--envoy-check-address: 'nope' is not host:port" in capsys.readouterr().err


def test_leaf_refuses_a_default_metrics_port_past_65535(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The metrics port defaults to the probe port + 10000: a probe on 61111 crashed the agent with a
    traceback (OverflowError from bind) after its gRPC server had started; now it is a usage error."""
    path, _ = _leaf_config(tmp_path, f"127.0.0.1:{free_port()}")
    data = json.loads(path.read_text())
    data["cells"][0]["leaf"]["probe"] = "127.0.0.1:61111"
    path.write_text(json.dumps(data))
    assert main(["serve", "leaf", "--config", str(path), "--cell", "a"]) == 1
    assert "leaf.probe port 61111 + 10000 (the default metrics port) is past 65535; give --metrics" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# 6. dlb envoy drain
# --------------------------------------------------------------------------------------------


def test_active_requests_sums_listeners_but_not_admin() -> None:
    text = ("http.admin.downstream_rq_active: 1\nhttp.dlb_leaf.downstream_rq_active: 3\n"
            "http.dlb_ready.downstream_rq_active: 1\nhttp.dlb_leaf.downstream_rq_active_total: 9\n")
    assert active_requests(text) == 4


# --------------------------------------------------------------------------------------------
# 7. control plane: --serve-cells, --watch-config
# --------------------------------------------------------------------------------------------


def test_serve_cells_builds_snapshots_and_flow_loops_for_those_cells_only() -> None:
    cfg = config_from_dict(_cp_config(("a", "b", "c")))
    cp = ControlPlane(cfg, probe=False, flow_loop=False, serve_cells=["b", "c"])
    assert set(cp.cache.keys()) == {"dlb-leaf/b", "dlb-root/b", "dlb-leaf/c", "dlb-root/c"}
    assert cp.sources == [1, 2] and cp.flow is not None and sorted({s for _, s in cp.flow.routers}) == [1, 2]
    assert set(ControlPlane(cfg, probe=False, flow_loop=False).cache.keys()) >= {"dlb-leaf/a", "dlb-root/a"}
    with pytest.raises(ValueError, match="not in"):
        ControlPlane(cfg, probe=False, flow_loop=False, serve_cells=["mars"])


def test_serve_cells_names_an_unknown_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlb.yaml"
    path.write_text(json.dumps(_cp_config(("a", "b"))))
    assert main(["serve", "control-plane", "--config", str(path), "--serve-cells", "a,mars"]) == 1
    assert "--serve-cells: mars" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# 4. server discovery: a DNS name is every address it has, re-resolved and pushed over EDS
# --------------------------------------------------------------------------------------------


def test_expand_makes_one_server_per_address_and_counts_unset_replicas() -> None:
    cfg = config_from_dict(_discovery_config(5.0))
    assert cfg.cell("a").replicas_auto and cfg.discovery.dns_period_s == 5.0
    out = expand(cfg, {HEADLESS: ["10.0.0.3", "10.0.0.2", "10.0.0.3"]})
    assert [str(s.address) for s in out.cell("a").servers] == ["10.0.0.2:8000", "10.0.0.3:8000"]
    assert out.cell("a").replicas == 2
    assert expand(cfg, {}).cell("a").servers == cfg.cell("a").servers  # not resolved yet: the name stays
    fixed = config_from_dict(_discovery_config(5.0, replicas=7))
    assert expand(fixed, {HEADLESS: ["10.0.0.2", "10.0.0.3"]}).cell("a").replicas == 7  # set in the file: kept


def test_discovery_period_is_checked() -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(_discovery_config(0.0))
    assert [p.path for p in e.value.problems] == ["discovery.dns_period_s"]


def test_leaf_agent_starts_with_every_address_of_a_server_name() -> None:
    """It used to resolve a name once, to its first address: one pod of a headless Service."""
    cfg = config_from_dict(_discovery_config(5.0))
    state = state_from_config(cfg, "a", resolve=lambda host, port: ["10.0.0.2", "10.0.0.3", "10.0.0.4"])
    assert sorted(s.address for s in state.servers) == ["10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"]
    assert state.replicas == 3
