"""``dlb up --config FILE``: ready means routable, the URLs it prints work, and it stops in order.

Two emulated servers (in this process) behind a 2-cell config on free ports; ``dlb up`` runs as the
real CLI in a subprocess. The first request after "ready" must be routed (no 503 ``no usable cell``:
ready waits for fresh probes); a crashed child is restarted; SIGTERM stops everything within 10 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dlb.emulator.server import ThreadedEmulator
from dlb.launch.supervisor import processes_of_run
from dlb.testbed.fleet import CellPlan, Fleet, demo_config
from dlb.testbed.stack import request

pytestmark = pytest.mark.envoy
REPO = Path(__file__).resolve().parents[2]


def _start_up(config: Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """`dlb up` as a user starts it, in a session of its own (so a stuck child can be killed with its group)."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen([sys.executable, "-m", "dlb.cli", "up", "--config", str(config), "--run-dir", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)


def _up_with(cfg: dict, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """``cfg`` written to ``tmp_path/dlb.yaml`` and ``dlb up`` started on it; returns the process and its run dir."""
    path = tmp_path / "dlb.yaml"
    path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "run"
    return _start_up(path, run_dir), run_dir


def _read_until(proc: subprocess.Popen[str], pattern: str, seen: list[str], timeout: float = 120.0) -> re.Match[str]:
    assert proc.stdout is not None
    end = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
        if time.monotonic() > end:
            break
    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(seen[-30:])}")


def _two_cells(a: str, b: str) -> dict:
    """us-east1 (with a root) and us-west1, one server each."""
    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    return demo_config(fleet, {"us-east1": [a], "us-west1": [b]})


def _ready_root(proc: subprocess.Popen[str], seen: list[str]) -> tuple[str, int]:
    """Read ``dlb up``'s output until it is ready; the root's host and port from its printed base_url."""
    m = _read_until(proc, r"root us-east1: base_url http://([\d.]+):(\d+)/v1", seen)
    _read_until(proc, r"Ctrl-C stops everything", seen)
    return m.group(1), int(m.group(2))


def _stop_run(proc: subprocess.Popen[str], run_dir: Path) -> None:
    """Stop ``dlb up`` as Ctrl-C would, then kill whatever of its run is left."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    for pid in processes_of_run(run_dir):
        os.kill(pid, signal.SIGKILL)


def _openai_sdk_through(base_url: str) -> None:
    """The printed ``base_url`` works as a user's OpenAI client uses it: chat, streamed chat with usage,
    completions, and DLB's errors arriving as the SDK's typed exceptions."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["dlb-emulated"]
    chat = client.chat.completions.create(model="dlb-emulated", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(model="dlb-emulated", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    done = client.completions.create(model="dlb-emulated", prompt="Once upon", max_tokens=4)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens == 4
    assert len(list(client.completions.create(model="dlb-emulated", prompt="Once", max_tokens=4, stream=True))) >= 4
    with pytest.raises(openai.NotFoundError, match="dlb: no endpoint"):  # a path no endpoint serves: DLB's own 404
        client.with_options(base_url=base_url.removesuffix("/v1")).chat.completions.create(
            model="dlb-emulated", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):  # the server's 400 passes through untouched
        client.chat.completions.create(model="dlb-emulated", messages=[{"role": "user", "content": "hi"}], max_tokens=-1)


def test_up_serves_after_ready_restarts_a_crashed_child_and_stops_in_order(tmp_path: Path) -> None:
    with ThreadedEmulator(server_id="a/0", profile="fast-test") as ea, ThreadedEmulator(server_id="b/0", profile="fast-test") as eb:
        cfg = _two_cells(ea.address, eb.address)
        proc, run_dir = _up_with(cfg, tmp_path)
        seen: list[str] = []
        try:
            host, port = _ready_root(proc, seen)
            # Ready means routable: the very first request is served by a server, not refused by the root.
            status, headers, _ = request(host, port)
            assert status == 200 and headers.get("x-dlb-server") in ("a/0", "b/0"), (status, headers)
            _openai_sdk_through(f"http://{host}:{port}/v1")
            # Every port printed before anything started: the config's by field (a root's admin too), the drawn ones named as such.
            text = "".join(seen)
            assert text.index("dlb up: listening on") < text.index("ready (pid"), text
            assert "services.control_plane.xds" in text and "cells[0].leaf.probe" in text and "services.root.admin (root us-east1 Envoy)" in text
            # No root_token_file in the config: a fresh random token for this run, private, not the derived one.
            token_file = run_dir / "root-token"
            assert "root token generated in" in "".join(seen) and (token_file.stat().st_mode & 0o777) == 0o600
            from dlb.config import config_from_dict
            from dlb.envoy.root_token import root_token

            assert token_file.read_text().strip() != root_token(config_from_dict(cfg))
            # No tls section either: a private CA for this run, and the leaves' gRPC port refuses plaintext.
            assert "mTLS between the control plane, roots and leaves" in "".join(seen) and (run_dir / "pki" / "ca.pem").exists()
            import grpc

            from dlb.proto import probe_pb2, probe_pb2_grpc

            with grpc.insecure_channel(str(config_from_dict(cfg).cells[0].leaf.probe)) as ch, pytest.raises(grpc.RpcError):
                probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(), timeout=3)
            # A crashed child is noticed, restarted with backoff, and said so on the console.
            agent = int(re.search(r"leaf us-west1 agent: ready \(pid (\d+)", "".join(seen)).group(1))  # type: ignore[union-attr]
            os.kill(agent, signal.SIGKILL)
            _read_until(proc, r"leaf us-west1 agent: exited with -9; restarting in 0.5s", seen, 30)
            _read_until(proc, r"leaf us-west1 agent: restarted", seen, 30)
            # SIGHUP is the control planes' reload, passed on; it used to end dlb up and SIGKILL every child.
            proc.send_signal(signal.SIGHUP)
            _read_until(proc, r"dlb up: SIGHUP: 2 control plane\(s\) reload", seen, 30)
            deadline = time.monotonic() + 30
            while "config_reloaded" not in (run_dir / "control-plane.log").read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "config_reloaded" in (run_dir / "control-plane.log").read_text() and proc.poll() is None
            # A file the control planes would refuse: the console says so, naming file and field, instead
            # of announcing a reload that only their logs said was refused.
            (tmp_path / "dlb.yaml").write_text(json.dumps({**cfg, "probe": {"period_ms": -20}}))
            proc.send_signal(signal.SIGHUP)
            _read_until(proc, r"dlb up: SIGHUP: not reloaded, the control planes keep the running config", seen, 30)
            _read_until(proc, r"dlb\.yaml:\d+: probe\.period_ms: must be > 0", seen, 10)
            # A file that needs processes dlb up did not start (a leaf moved): refused and named, not
            # half-applied (the control planes would send to a probe address nothing binds).
            moved = json.loads(json.dumps(cfg))
            moved["cells"][1]["leaf"]["probe"] = "127.0.0.1:1"
            (tmp_path / "dlb.yaml").write_text(json.dumps(moved))
            proc.send_signal(signal.SIGHUP)
            _read_until(proc, r"restart it to apply: leaf us-west1 changed", seen, 30)
            assert "SIGHUP: not reloaded" in "".join(seen).rsplit("probe.period_ms", 1)[1]
            # A child restarted after a refused reload starts from the config dlb up last accepted (a copy
            # in the run folder), not from the operator's refused file: it used to re-read that and crash-loop.
            (tmp_path / "dlb.yaml").write_text(json.dumps({**cfg, "probe": {"period_ms": -20}}))
            agent = int(re.findall(r"leaf us-west1 agent: restarted \(pid (\d+)", "".join(seen))[-1])
            os.kill(agent, signal.SIGKILL)
            _read_until(proc, r"leaf us-west1 agent: restarted \(pid \d+, restart 2\)", seen, 30)
            _read_until(proc, r"leaf us-west1 agent: ready", seen, 30)
            assert "leaf us-west1 agent: exited with 1" not in "".join(seen)
            assert json.loads((run_dir / "config.yaml").read_text()) == cfg  # the last accepted file, as it was
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
            seen.append(out)
            assert time.monotonic() - t0 < 10.0
            assert proc.returncode == 0
            text = "".join(seen)
            order = [text.index(f"{who}: stopped") for who in ("root us-east1 service", "leaf us-east1 agent", "control-plane")]
            assert order == sorted(order), "stop order must be roots, leaves, control plane"
            assert "did not stop on SIGTERM" not in text, text  # every service exits within its tier's share
            assert processes_of_run(run_dir) == []
            assert (run_dir / "control-plane.log").exists() and (run_dir / "leaf-us-east1-envoy.log").exists()
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in processes_of_run(run_dir):
                os.kill(pid, signal.SIGKILL)


def test_a_root_is_not_ready_until_every_allowed_cell_is_usable_for_every_endpoint(tmp_path: Path) -> None:
    import http.server
    import threading

    from dlb.config import config_from_dict
    from dlb.launch.up import probes_fresh
    from dlb.procutil import free_port

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")),
                  allowed={"us-east1": ["us-east1", "us-west1"]})
    cfg = config_from_dict(demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]}))
    body = {"text": ""}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: object) -> None:
            pass

    port = free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        def metrics(**usable: float) -> str:
            return "\n".join(f'dlb_root_cell_usable{{endpoint="{ep}",cell="{c}"}} {usable.get(f"{ep}_{c}".replace("-", "_"), 1.0)}'
                             for ep in ("chat", "completions") for c in ("us-east1", "us-west1"))

        body["text"] = metrics()
        assert probes_fresh(url, cfg, "us-east1")
        body["text"] = metrics(completions_us_west1=0.0)  # one endpoint has not heard from one leaf yet
        assert not probes_fresh(url, cfg, "us-east1")
        body["text"] = ""  # no samples at all (a root that has not started its probes)
        assert not probes_fresh(url, cfg, "us-east1")
    finally:
        srv.shutdown()


def test_up_refuses_a_config_whose_addresses_it_cannot_listen_on_naming_file_and_field(tmp_path: Path) -> None:
    """An xDS listener that cannot bind leaves its Envoy running (a NACK), so without this check
    ``dlb up`` waited its whole ready timeout and then named only "leaf us-east1 envoy"."""
    import socket

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    cfg = demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]})
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # another process (an earlier `dlb up`) holds us-east1's leaf listener
    try:
        cfg["cells"][0]["leaf"]["address"] = f"127.0.0.1:{taken.getsockname()[1]}"
        cfg["cells"][1]["leaf"]["probe"] = "192.0.2.1:9020"  # TEST-NET-1: not an address of this machine
        path = tmp_path / "dlb.yaml"
        path.write_text(json.dumps(cfg))
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        out = subprocess.run([sys.executable, "-m", "dlb.cli", "up", "--config", str(path), "--run-dir", str(tmp_path / "run")],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
    finally:
        taken.close()
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{path}: cells[0].leaf.address: cannot listen on 127.0.0.1:" in out.stderr, out.stderr
    assert "in use" in out.stderr
    assert "cells[0].leaf.listen" not in out.stderr, out.stderr  # the same loopback port, reported once
    assert f"{path}: cells[1].leaf.probe: cannot listen on 192.0.2.1:9020" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists() or processes_of_run(tmp_path / "run") == []


def test_up_says_what_a_root_waits_for_when_a_cell_has_no_live_server_then_starts_without_it(tmp_path: Path) -> None:
    """Every server of us-west1 is down: the console says what the root waits for every few seconds
    instead of staying silent (earlier reports may name an earlier step: a root service still importing
    on a loaded box waits for its own listener first, so the lines are read until the cell's reason).
    After a third of ``--ready-timeout`` the root starts without the cell, saying so, and serves from
    us-east1: it waited forever, so ``dlb up`` could not start during one cell's outage."""
    from dlb.procutil import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    why = f"cell us-west1: a healthy server (its leaf reports 0 of 1 healthy: is {dead} running?)"
    with ThreadedEmulator(server_id="a/0", profile="fast-test") as ea:
        fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
        path = tmp_path / "dlb.yaml"
        path.write_text(json.dumps(demo_config(fleet, {"us-east1": [ea.address], "us-west1": [dead]})))
        run_dir = tmp_path / "run"
        proc = _start_up(path, run_dir, "--ready-timeout", "60")
        seen: list[str] = []
        try:
            _read_until(proc, rf"root us-east1 service: not ready after \d+s: waiting for usable cells — {re.escape(why)}$", seen)
            assert "dlb up: ready" not in "".join(seen)
            _read_until(proc, r"root us-east1 service: starts without cell us-west1, which waits for a healthy server", seen)
            host, port = _ready_root(proc, seen)
            replies = [request(host, port) for _ in range(5)]
            assert [s for s, _, _ in replies] == [200] * 5 and {h.get("x-dlb-server") for _, h, _ in replies} == {"a/0"}
            # The server comes up: the console says the cell joined (it said it would, and nothing said when).
            with ThreadedEmulator(server_id="b/0", profile="fast-test", port=int(dead.rpartition(":")[2])):
                _read_until(proc, r"root us-east1 service: cell us-west1 joined: usable for every endpoint", seen)
                proc.send_signal(signal.SIGTERM)  # everything still stops
                out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0, "".join(seen) + out
            assert processes_of_run(run_dir) == []
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in processes_of_run(run_dir):
                os.kill(pid, signal.SIGKILL)


def test_up_runs_every_leaf_replica_of_a_cell_from_the_control_plane(tmp_path: Path) -> None:
    """``cells[].leaf.replicas``: each replica's Envoy gets its own listener from its own snapshot (ready
    means each listener accepts), and the root routes through both replicas to the cell's servers."""
    from dlb.procutil import free_port

    with ThreadedEmulator(server_id="a/0", profile="fast-test") as ea, ThreadedEmulator(server_id="b/0", profile="fast-test") as eb:
        cfg = _two_cells(ea.address, eb.address)
        cfg["cells"][0]["leaf"]["replicas"] = [{"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"}]
        cfg["network"] = {"allowed": {"us-east1": ["us-east1"]}, "one_way_ms": {"us-east1": {"us-west1": 10}}}
        proc, run_dir = _up_with(cfg, tmp_path)
        seen: list[str] = []
        try:
            host, port = _ready_root(proc, seen)
            assert "leaf us-east1 replica 1 agent: ready" in "".join(seen) and "leaf us-east1 envoy 2: ready" in "".join(seen)
            replies = [request(host, port) for _ in range(20)]
            assert [s for s, _, _ in replies] == [200] * 20 and {h.get("x-dlb-server") for _, h, _ in replies} == {"a/0"}
            from dlb.testbed.stack import metric_value

            text = "".join(seen)
            for who in ("leaf us-east1", "leaf us-east1 replica 1"):  # each replica's agent saw its Envoy's share
                url = re.search(rf"^{who}: metrics (\S+)", text, re.M).group(1)  # type: ignore[union-attr]
                with urllib.request.urlopen(url, timeout=5) as r:
                    assert (metric_value(r.read().decode(), "dlb_leaf_completed_total") or 0) >= 1, who
        finally:
            _stop_run(proc, run_dir)
