"""The access log steers a cell, so only the cell's own Envoy may feed it (issue 14 row 5).

Before: the agent served the access-log service on its probe port, which roots reach across the
network; one unauthenticated stream of 200,000 fake starts and 2,000 fake 503s black-holed the cell
(RIF 200,000, error rate 0.96, records kept up to 900 s). Now the access log has its own channel (a
Unix socket by default, or a loopback port), the in-flight table is bounded, and the records a stream
opened are dropped when that stream ends.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from pathlib import Path

import grpc
import pytest
from envoy.service.accesslog.v3 import als_pb2_grpc
from test_leaf_als_channel_unit import raw_config, starts

from dlb.config import config_from_dict
from dlb.config.policy import set_plugins
from dlb.envoy.bootstrap import leaf_bootstrap
from dlb.procutil import free_port
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(120)


def test_probe_port_does_not_serve_the_access_log_and_its_own_channel_is_tied_to_the_stream() -> None:
    raw = set_plugins(raw_config(), {"type": "background-probe", "parameters": {"min_interval_ms": 0}})  # only the test's starts count
    cfg = config_from_dict(raw)
    channel = cfg.cells[0].leaf.access_log_address()
    assert channel.startswith("unix:/")
    with tempfile.TemporaryDirectory(prefix="dlb-als-") as tmp:
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(raw))
        leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "", "--envoy-check-period-ms", "0",
                              "--scrape-period-ms", "0")
        with leaf, grpc.insecure_channel(str(cfg.cells[0].leaf.probe)) as probe_ch, grpc.insecure_channel(channel) as als_ch:
            probe = probe_pb2_grpc.ProbeStub(probe_ch)
            # 1. A peer on the network (the probe port) cannot open an access-log stream at all.
            with pytest.raises(grpc.RpcError) as info:
                als_pb2_grpc.AccessLogServiceStub(probe_ch).StreamAccessLogs(iter([starts(10)]), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert probe.Probe(probe_pb2.ProbeRequest(), timeout=5).rif == 0
            # 2. On its own channel, the starts a stream reported count while it is open...
            release = threading.Event()

            def held():
                yield starts(2000)
                release.wait(60)

            fut = als_pb2_grpc.AccessLogServiceStub(als_ch).StreamAccessLogs.future(held(), timeout=60)
            rif = 0
            while rif != 2000:  # bounded by the test timeout
                rif = int(probe.Probe(probe_pb2.ProbeRequest(), timeout=5).rif)
            # 3. ...and are forgotten as soon as it ends (not after max_age_s = 900 s).
            release.set()
            fut.result(10)
            while rif != 0:
                rif = int(probe.Probe(probe_pb2.ProbeRequest(), timeout=5).rif)
    assert not Path(channel[len("unix:"):]).exists(), "the agent removes its socket on exit"


def test_bootstrap_feeds_the_agent_over_its_own_channel(tmp_path: Path) -> None:
    from dlb.envoy.binary import validate
    from dlb.envoy.bootstrap import write_bootstrap

    for leaf, want in (({}, "pipe"), ({"access_log": "127.0.0.1:9999"}, "socket_address")):
        cfg = config_from_dict(raw_config(**leaf))
        boot = leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False, access_log=True)
        agent = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "dlb_leaf_agent")
        addr = agent["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        probe = cfg.cells[0].leaf.probe
        assert want in addr and addr != {"socket_address": {"address": probe.host, "port_value": probe.port}}
        path = tmp_path / f"{want}.yaml"
        write_bootstrap(boot, path)
        checked = validate(path)
        assert checked.returncode == 0, checked.stderr + checked.stdout


def test_killed_agents_leave_nothing_behind_in_tmp_and_a_clean_stop_removes_the_directory(tmp_path: Path) -> None:
    """The per-run socket directory lives in the access log's private directory: a SIGKILLed agent's is
    removed by the next agent on that socket, and a clean stop removes the private directory it made.
    (It used to be a ``dlb-agent-*`` directory in the shared ``/tmp``, left behind by every kill.)"""
    private = tmp_path / "als"
    raw = raw_config(access_log=f"unix:{private}/als.sock")
    path = tmp_path / "dlb.yaml"
    path.write_text(json.dumps(raw))
    args = ("--config", str(path), "--cell", "a", "--metrics", "", "--envoy-check-period-ms", "0", "--scrape-period-ms", "0")
    private.mkdir(mode=0o700)
    other = private / "als.sock.xy12ab34"  # looks like ours but is not a directory: left alone
    other.write_text("")
    neighbour = private / "als-b.sock.k3j4h5g6"  # another agent's, on another socket in the same directory
    neighbour.mkdir()
    for _ in range(3):
        leaf = ServiceProcess("leaf", *args).start()
        mine = [p for p in private.glob("als.sock.*") if p.is_dir()]
        assert len(mine) == 1  # this run's, and none of the killed runs'
        assert Path(f"{private}/als.sock").is_socket() and neighbour.is_dir()
        os.kill(leaf.pid, signal.SIGKILL)
        leaf.proc.wait(10)
    other.unlink()
    neighbour.rmdir()
    with ServiceProcess("leaf", *args):
        names = sorted(p.name for p in private.iterdir())
        assert len(names) == 2 and names[0] == "als.sock" and names[1].startswith("als.sock.")
    assert list(private.iterdir()) == []  # a configured directory the agent did not make stays, empty
    private.rmdir()
    with ServiceProcess("leaf", *args):
        assert private.is_dir()
    assert not private.exists()  # made by the agent, empty at its stop: removed


def test_an_agent_leaves_the_other_agents_sockets_in_a_shared_directory_alone(tmp_path: Path) -> None:
    """The testbed puts every agent's socket in one directory; an agent starting there removes only what
    killed agents left for its own socket, never a running neighbour's directory."""
    shared = tmp_path / "als"
    agents = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(raw_config(access_log=f"unix:{shared}/als-{name}.sock")))
        agents.append(ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "",
                                     "--envoy-check-period-ms", "0", "--scrape-period-ms", "0"))
    with agents[0]:
        first = [p for p in shared.iterdir() if p.is_dir()]
        with agents[1]:
            assert all(p.is_dir() for p in first)  # a's directory survived b's start
            assert len([p for p in shared.iterdir() if p.is_dir()]) == 2
            with grpc.insecure_channel(f"unix:{shared}/als-a.sock") as ch:  # and a still takes its access log
                grpc.channel_ready_future(ch).result(timeout=10)
