"""Multi-host DLB on one box (issue 17, acceptance criterion 5): a namespace per cell, root, control plane, client.

Three cells (two emulated servers, a leaf Envoy and a leaf agent each), a root (Envoy + root
service) and two control-plane replicas, each in its own network namespace on a bridge (198.18.0.0/24), with
nothing added to the machine's namespace (:mod:`dlb.testbed.netns`). Checked, in order, on one
deployment:

1. 300 requests from the client's namespace through the root reach servers in every cell, 0 errors;
2. the control plane's ``/status`` shows every Envoy ACKing the version it was sent, for every type;
3. nothing listens on 127.0.0.1 but Envoy admin and the root's in-pod ext_proc hop;
4. with one cell's processes frozen (SIGSTOP: probes time out, only staleness removes it) and then
   another cell's killed, the root marks each unusable (printed: seconds after the stop, against
   ``probe.stale_after_ms`` + 1 s; not asserted, the machine is shared), sends it nothing more and
   every request sent after that succeeds; the frozen cell is usable again once thawed;
5. with two control-plane replicas (hosts ``cp``, ``cp2``), killing one re-homes every node to the
   other within 2 s, no version going backwards, no request failing;
6. a ``preStop``-style drain of the root Envoy (``dlb envoy drain``, then SIGTERM) loses none of the
   requests in flight;
7. after the run, none of the lab's namespaces is left (also when the body raised: separate test).

Runs as root with ``ip netns``; otherwise skipped with the reason.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from bounded_wait import until

from dlb.launch.supervisor import Supervisor
from dlb.testbed.netns import Lab, entered, lab_namespaces, unavailable
from dlb.testbed.netns_fleet import ADMIN_PORT, NetnsDeployment, NetnsPlan, plan, unexpected_loopback
from dlb.testbed.stack import metric_value

_WHY = unavailable()
pytestmark = [pytest.mark.netns, pytest.mark.envoy, pytest.mark.skipif(_WHY is not None, reason=f"netns testbed: {_WHY}")]

BODY = {"model": "dlb-emulated", "prompt": "hi", "max_tokens": 4}


def _post(dep: NetnsDeployment, body: dict[str, object] = BODY, timeout: float = 30.0) -> tuple[int, str, bytes]:
    """One completion from the client's namespace through the root: (status, x-dlb-server, body)."""
    host, port = dep.root_url
    with entered(dep.host("client")):
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.connect()  # the socket is made in the client's namespace and stays there
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("x-dlb-server") or "", resp.read()
    except (OSError, http.client.HTTPException, ValueError) as e:  # a cut stream is a lost request, not a crash
        return 0, "", repr(e).encode()
    finally:
        conn.close()


def _send(dep: NetnsDeployment, n: int, workers: int = 8) -> list[tuple[int, str, bytes]]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda _: _post(dep), range(n)))


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsDeployment]:
    p = NetnsPlan()
    lab = Lab(p.host_names)
    with lab:
        sup = Supervisor(Path(tmp_path_factory.mktemp("netns")) / "run")
        sup.quiet = True
        d = plan(lab, p, sup)
        try:
            sup.start(timeout_s=120)
            yield d
        finally:
            sup.stop()
    assert lab_namespaces(lab.prefix) == []


def test_requests_reach_every_cell_with_no_errors(dep: NetnsDeployment) -> None:
    results = _send(dep, 300)
    errors = [(s, b[:200]) for s, _, b in results if s != 200]
    assert not errors, errors[:5]
    per_cell = Counter(server.split("/")[0] for _, server, _ in results)
    print(f"\n300 requests through the root, per cell: {dict(per_cell)}")
    assert set(per_cell) == set(dep.plan.cells), per_cell


def _nodes(dep: NetnsDeployment, urls: list[str]) -> dict[str, dict]:
    """Nodes with an open stream on any of the replicas at ``urls`` (read from the client's namespace)."""
    nodes: dict[str, dict] = {}
    for url in urls:
        with contextlib.suppress(OSError, ValueError):
            status = json.loads(dep.get("client", f"{url}/status", timeout=0.5)[1])
            nodes.update({n: ns for n, ns in status["nodes"].items() if ns["streams"] > 0})
    return nodes


def test_status_shows_every_envoy_acked(dep: NetnsDeployment) -> None:
    envoys = {f"leaf-{c}" for c in dep.plan.cells} | {f"root-{dep.plan.cells[0]}"}
    nodes = _nodes(dep, dep.status_urls)  # each Envoy follows one of the replicas
    assert envoys <= set(nodes), sorted(nodes)
    for node in envoys:
        types = nodes[node]["types"]
        assert {"CDS", "LDS"} <= set(types), (node, sorted(types))
        for t, st in types.items():
            assert st["acked_version"], (node, t, st)
            assert not st.get("last_nack_reason"), (node, t, st)


def test_nothing_on_loopback_but_admin_and_the_ext_proc_hop(dep: NetnsDeployment) -> None:
    assert unexpected_loopback(dep) == []
    # Planted: a service bound to the control plane's loopback is reported.
    with subprocess.Popen(dep.host("cp").argv([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "18999"]),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as planted:
        try:
            until(lambda: unexpected_loopback(dep), "the planted loopback service reported", timeout=20, period=0.1)
            assert any("cp: 127.0.0.1:18999" in p for p in unexpected_loopback(dep))
        finally:
            planted.kill()


def _usable(dep: NetnsDeployment, cell: str) -> float | None:
    text = dep.get("root", dep.root_metrics_url)[1]
    return metric_value(text, "dlb_root_cell_usable", endpoint="completions", cell=cell)


def _wait_usable(dep: NetnsDeployment, cell: str, value: float, t0: float) -> float:
    """Seconds from ``t0`` until the root reports ``dlb_root_cell_usable`` = ``value`` for ``cell`` (bounded: 30 s)."""
    until(lambda: _usable(dep, cell) == value, f"{cell} usable == {value}", timeout=max(0.0, t0 + 30 - time.monotonic()))
    return time.monotonic() - t0


def _no_share_and_all_succeed(dep: NetnsDeployment, gone: str) -> None:
    results = _send(dep, 60)
    assert all(s == 200 for s, _, _ in results), [(s, b[:200]) for s, _, b in results if s != 200][:5]
    assert not [srv for _, srv, _ in results if srv.startswith(gone + "/")]


def test_frozen_cell_gets_no_share_and_requests_keep_succeeding(dep: NetnsDeployment) -> None:
    """SIGSTOP a cell's processes: its probes time out (nothing refuses them), so only staleness removes it."""
    frozen = dep.plan.cells[1]
    assert _usable(dep, frozen) == 1.0
    procs = [c.proc for c in dep.children[frozen] if c.proc is not None]
    t0 = time.monotonic()
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        took = _wait_usable(dep, frozen, 0.0, t0)
        print(f"\ncell {frozen} frozen: unusable at the root after {took:.2f} s "
              f"(bound: stale_after_ms {dep.plan.stale_after_ms} + 1 s = {dep.plan.stale_after_ms / 1000 + 1:.1f} s)")
        _no_share_and_all_succeed(dep, frozen)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
    print(f"cell {frozen} thawed: usable again after {_wait_usable(dep, frozen, 1.0, time.monotonic()):.2f} s")


def test_stopped_cell_gets_no_share_and_requests_keep_succeeding(dep: NetnsDeployment) -> None:
    gone = dep.plan.cells[-1]
    assert _usable(dep, gone) == 1.0
    t0 = time.monotonic()
    for child in dep.children[gone]:  # leaf Envoy, leaf agent and servers: the cell's host goes dark
        child.state = "stopped"
        assert child.proc is not None
        child.proc.kill()
        child.proc.wait(10)
    took = _wait_usable(dep, gone, 0.0, t0)
    print(f"\ncell {gone} killed: unusable at the root after {took:.2f} s (refused probes fail at once)")
    _no_share_and_all_succeed(dep, gone)


def test_killing_one_control_plane_replica_rehomes_every_node_and_loses_nothing(dep: NetnsDeployment) -> None:
    """SIGKILL the replica on ``cp``: every Envoy and service it served re-homes to ``cp2`` across the
    bridge within 2 s with an ACKed version no older than before, and requests keep succeeding."""
    def acked(nodes: dict[str, dict]) -> dict[str, dict[str, str]]:
        return {n: {t: st["acked_version"] for t, st in ns["types"].items() if st["acked_version"]} for n, ns in nodes.items()}

    before = acked(_nodes(dep, dep.status_urls))
    alive = [c for c in dep.plan.cells if all(ch.state != "stopped" for ch in dep.children[c])]  # a test above stops one
    assert len(before) >= 2 * len(alive) + 2, sorted(before)  # leaf Envoys + agents, root Envoy + service
    moved = set(acked(_nodes(dep, dep.status_urls[:1])))
    child = next(c for c in dep.children["cp"] if c.name == "control-plane cp")
    child.state = "stopped"  # the supervisor must not restart it: the survivor is what is measured
    assert child.proc is not None
    load: list[tuple[int, str, bytes]] = []
    sender = threading.Thread(target=lambda: load.extend(_send(dep, 120, workers=4)))
    sender.start()
    t0 = time.monotonic()
    child.proc.kill()
    rehomed: dict[str, float] = {}
    after: dict[str, dict[str, str]] = {}
    while time.monotonic() - t0 < 10 and len(rehomed) < len(before):
        for n, vs in acked(_nodes(dep, dep.status_urls[1:])).items():
            if n in before and n not in rehomed and set(vs) >= set(before[n]):
                rehomed[n], after[n] = time.monotonic() - t0, vs
        time.sleep(0.05)
    sender.join(120)
    print(f"\ncontrol plane on cp killed: {len(moved)} nodes it served re-homed to cp2 after (s) "
          f"{ {n: round(rehomed[n], 2) for n in sorted(moved) if n in rehomed} }; requests {len(load)}, "
          f"failed {sum(1 for st, _, _ in load if st != 200)}")
    assert set(before) <= set(rehomed), sorted(set(before) - set(rehomed))
    assert max(rehomed.values()) <= 2.0, rehomed
    assert not [(n, t) for n in before for t in before[n] if after[n][t] < before[n][t]]
    assert all(st == 200 for st, _, _ in load), [(st, b[:200]) for st, _, b in load if st != 200][:5]


def _active(dep: NetnsDeployment) -> float:
    text = dep.get("root", f"http://127.0.0.1:{ADMIN_PORT}/stats?filter=downstream_rq_active")[1]
    return sum(float(v) for v in re.findall(r"^http\.(?!admin\.)[^:]+\.downstream_rq_active: (\d+)$", text, re.M))


def _drain(dep: NetnsDeployment, deadline_s: float) -> None:
    """What the root pod's preStop does (deploy/k8s): ``dlb envoy drain``, run inside the root's namespace."""
    out = subprocess.run(dep.host("root").argv([sys.executable, "-m", "dlb.cli", "envoy", "drain", "--admin-port", str(ADMIN_PORT),
                                                "--deadline", str(deadline_s)]), capture_output=True, text=True, timeout=deadline_s + 30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_drain_loses_no_request_in_flight(dep: NetnsDeployment) -> None:
    """preStop: drain the root Envoy gracefully, wait for its last request, then stop it; none is lost."""
    slow = {"model": "dlb-emulated", "prompt": "hi", "max_tokens": 200, "stream": True}
    results: list[tuple[int, str, bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(_post(dep, slow, timeout=60))) for _ in range(6)]
    for t in threads:
        t.start()
    with contextlib.suppress(AssertionError):  # at least one in flight is enough (asserted below)
        until(lambda: _active(dep) >= len(threads), "every slow request in flight", timeout=20, period=0.02)
    in_flight = _active(dep)
    assert in_flight >= 1
    _drain(dep, deadline_s=60)
    envoy = next(c for c in dep.children["root"] if c.name.endswith("envoy"))
    envoy.state = "stopped"
    assert envoy.proc is not None
    envoy.proc.terminate()
    envoy.proc.wait(10)
    for t in threads:
        t.join(60)
    print(f"\ndrain: {in_flight:.0f} requests in flight when the drain began, {len(results)} finished")
    assert len(results) == len(threads)
    lost = [(s, b[-200:]) for s, _, b in results if s != 200 or b"[DONE]" not in b]
    assert not lost, lost


def test_lab_removes_its_namespaces_even_when_the_body_fails() -> None:
    lab = Lab(["a", "b"])
    with pytest.raises(RuntimeError, match="boom"), lab:
        assert len(lab_namespaces(lab.prefix)) == 3  # the bridge's and two hosts'
        sleeper = subprocess.Popen(lab.hosts["a"].argv(["sleep", "600"]))  # the lab must kill it on the way out
        raise RuntimeError("boom")
    assert sleeper.wait(10) != 0
    assert lab_namespaces(lab.prefix) == []
