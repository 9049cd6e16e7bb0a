"""``dlb up --otlp-endpoint``: one request with a sampled ``traceparent`` gives one trace at a real OTLP
collector of ≥ 4 linked spans — the root Envoy's, the root's decision, the leaf Envoy's and the leaf's
pick — every one a child of the client's span or of another span of the trace, the leaf Envoy's a child
of the root Envoy's; a request without one (ratio 0) gives none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from bounded_wait import until
from test_up import REPO, _read_until

from dlb.emulator.server import ThreadedEmulator
from dlb.launch.supervisor import processes_of_run
from dlb.procutil import free_port
from dlb.service.tracing import otlp_unavailable
from dlb.testbed.fleet import CellPlan, Fleet, demo_config
from dlb.testbed.otlp_collector import Collector
from dlb.testbed.stack import request

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(240), pytest.mark.skipif(otlp_unavailable() is not None, reason=f"{otlp_unavailable()}")]
TRACE_ID, CLIENT_SPAN = "5af7651916cd43dd8448eb211c80319d", "c7ad6b7169203331"
TRACED = 12


@contextmanager
def traced_up(tmp_path: Path, ratio: str) -> Iterator[tuple[str, int, Collector]]:
    """``dlb up --otlp-endpoint`` (leaf agents picking) over two emulated cells; yields its root's address and the collector."""
    collector = Collector()
    otlp = collector.start()
    run_dir = tmp_path / "run"
    with ThreadedEmulator(server_id="a/0", profile="fast-test") as ea, ThreadedEmulator(server_id="b/0", profile="fast-test") as eb:
        fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
        cfg = demo_config(fleet, {"us-east1": [ea.address], "us-west1": [eb.address]})
        for cell in cfg["cells"]:  # the leaf agents pick the server (without, Envoy's LEAST_REQUEST does: no pick span)
            cell["leaf"]["ext_proc"] = f"127.0.0.1:{free_port()}"
        (tmp_path / "dlb.yaml").write_text(json.dumps(cfg))
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "up", "--config", str(tmp_path / "dlb.yaml"), "--run-dir", str(run_dir),
                                 "--otlp-endpoint", f"127.0.0.1:{otlp}", "--trace-sample-ratio", ratio],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        seen: list[str] = []
        try:
            m = _read_until(proc, r"root us-east1: base_url http://([\d.]+):(\d+)/v1", seen)
            _read_until(proc, r"Ctrl-C stops everything", seen)
            yield m.group(1), int(m.group(2)), collector
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in processes_of_run(run_dir):
                os.kill(pid, signal.SIGKILL)
            collector.stop()


def complete_trace(collector: Collector) -> str | None:
    """A trace to which all four kinds of service (both Envoys, the root, a leaf) sent a span."""
    roles: dict[str, set[str]] = {}  # trace → the kinds of service that sent it a span
    for svc, sp in list(collector.spans):
        roles.setdefault(sp.trace_id.hex(), set()).add(svc.rsplit("-", 2)[0] if svc.count("-") >= 2 else svc)
    return next((t for t, r in roles.items() if {"envoy-root", "dlb-root", "envoy-leaf", "dlb-leaf"} <= r), None)


def parents_arrived(collector: Collector, trace: str) -> bool:
    """Every span of ``trace`` hangs off the client's span or another span of the trace already collected."""
    spans = [sp for _, sp in list(collector.spans) if sp.trace_id.hex() == trace]
    ids = {sp.span_id.hex() for sp in spans} | {CLIENT_SPAN}
    return all(sp.parent_span_id.hex() in ids for sp in spans)


def dlb_traces(collector: Collector) -> set[str]:
    """The traces DLB's services sent spans of."""
    return {sp.trace_id.hex() for svc, sp in list(collector.spans) if svc.startswith("dlb-")}


def envoy_traces(collector: Collector) -> set[str]:
    """The traces the Envoys sent spans of."""
    return {sp.trace_id.hex() for svc, sp in list(collector.spans) if svc.startswith("envoy-")}


def test_one_request_through_dlb_up_is_one_trace_with_the_decision_and_the_pick(tmp_path: Path) -> None:
    with traced_up(tmp_path, "0") as (host, port, collector):
        # Just after start a leaf Envoy may not reach its ext_proc yet and picks by itself (fail open), with no
        # pick span (the first few requests in most runs here); one complete trace is the claim.
        served = {}
        trace = None
        for k in range(TRACED):  # one more traced request every 12 s until a trace is complete
            status, headers, _ = request(host, port, headers={"traceparent": f"00-{TRACE_ID[:-2]}{k:02x}-{CLIENT_SPAN}-01"})
            assert status == 200
            served[f"{TRACE_ID[:-2]}{k:02x}"] = headers["x-dlb-server"]
            if k == 0:
                assert request(host, port)[0] == 200  # unsampled: no span
            try:
                trace = until(lambda: complete_trace(collector), "one trace with all four spans", timeout=12)  # Envoy flushes every 5 s
                break
            except AssertionError:
                continue
        got = sorted({(svc, sp.name, sp.trace_id.hex()[-2:]) for svc, sp in collector.spans})
        assert trace is not None, f"no complete trace after {TRACED} traced requests, 12 s apart; spans: {got}"
        # Each Envoy flushes its spans on its own 5-s timer, and a span's parent may come in a later batch
        # (a loaded box): wait for the parents to arrive; a parent outside the trace never does.
        try:
            until(lambda: parents_arrived(collector, trace), "every span's parent in the trace", timeout=12)
        except AssertionError:
            pass  # asserted below, naming the span
    assert {sp.trace_id.hex() for _, sp in collector.spans} <= set(served)  # only the sampled requests
    spans = [(svc, sp) for svc, sp in collector.spans if sp.trace_id.hex() == trace]
    ingress = {svc: sp for svc, sp in spans if sp.name == "ingress"}  # each Envoy's span of the request itself
    dlb_spans = {sp.name: (svc, sp) for svc, sp in spans if sp.name.startswith("dlb.")}
    cell = next(a.value.string_value for a in dlb_spans["dlb.root.decide"][1].attributes if a.key == "dlb.cell")
    print(f"\none trace, {len(spans)} spans:", sorted((svc, sp.name) for svc, sp in spans))
    assert {"envoy-root-us-east1", "dlb-root-us-east1", f"envoy-leaf-{cell}", f"dlb-leaf-{cell}"} <= {svc for svc, _ in spans}
    assert len(spans) >= 4
    ids = {sp.span_id.hex() for _, sp in spans}
    for svc, sp in spans:  # linked: no span hangs off something outside the trace
        assert sp.parent_span_id.hex() in ids | {CLIENT_SPAN}, (svc, sp.name)
    assert ingress["envoy-root-us-east1"].parent_span_id.hex() == CLIENT_SPAN
    assert ingress[f"envoy-leaf-{cell}"].parent_span_id.hex() == ingress["envoy-root-us-east1"].span_id.hex()
    assert dlb_spans["dlb.root.decide"][0] == "dlb-root-us-east1" and dlb_spans["dlb.leaf.pick"][0] == f"dlb-leaf-{cell}"
    assert served[trace] == ("a/0" if cell == "us-east1" else "b/0")


def test_a_trace_envoy_starts_holds_the_decision_and_the_pick(tmp_path: Path) -> None:
    """No client ``traceparent``, every request sampled by the root Envoy: the services' spans join Envoy's
    trace as children of Envoy's span of their ext_proc call (the gRPC call's ``traceparent``), not a trace
    of their own."""
    with traced_up(tmp_path, "1") as (host, port, collector):
        trace = None
        for _ in range(TRACED):
            assert request(host, port)[0] == 200
            try:
                trace = until(lambda: complete_trace(collector), "one trace with all four spans", timeout=12)
                break
            except AssertionError:
                continue
        assert trace is not None, sorted({(svc, sp.name) for svc, sp in collector.spans})
        spans = [(svc, sp) for svc, sp in collector.spans if sp.trace_id.hex() == trace]
        # Envoys flush every 5 s, the services at once, and background probes keep starting traces: the DLB
        # traces so far must all show Envoy spans once those are flushed.
        ours = dlb_traces(collector)
        try:
            until(lambda: ours <= envoy_traces(collector), "every DLB span in a trace Envoy sent spans of", timeout=12)
        except AssertionError:
            pass  # asserted below
    by_id = {sp.span_id.hex(): (svc, sp) for svc, sp in spans}
    for name, envoy in (("dlb.root.decide", "envoy-root"), ("dlb.leaf.pick", "envoy-leaf")):
        sp = next(sp for _, sp in spans if sp.name == name)
        parent_svc, parent = by_id[sp.parent_span_id.hex()]
        assert parent_svc.startswith(envoy) and "ExternalProcessor" in parent.name, (name, parent_svc, parent.name)
    # Decisions in traces of their own (the services sampling alone) would show as dlb spans outside Envoy's traces.
    assert ours <= envoy_traces(collector), sorted(ours - envoy_traces(collector))
