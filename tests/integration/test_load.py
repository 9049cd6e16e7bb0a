"""Workloads (seeded, open loop) and the ``dlb load`` generator against a real local HTTP server."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import pytest
from aiohttp import web

from dlb.load.generator import LoadRunner, summarize, write_results
from dlb.load.workload import (
    WorkloadRequest,
)
from dlb.procutil import free_port


async def _server(port: int, delay_s: float, seen: list[dict]) -> web.AppRunner:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append({"path": request.path, "session": request.headers.get("x-session-id", ""), **body})
        if body.get("max_tokens") == 13:
            return web.json_response({"error": "boom"}, status=500)
        resp = web.StreamResponse(headers={"x-dlb-server": "cell-x/0"})
        await resp.prepare(request)
        await asyncio.sleep(delay_s)
        for _ in range(body["max_tokens"]):
            await resp.write(b'data: {"choices":[{"delta":{"content":"abcd"}}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def test_generator_streams_records_status_server_and_measures_from_the_scheduled_time(tmp_path: Path) -> None:
    port = free_port()
    reqs = [WorkloadRequest(0.0, "chat", "a", 10, 4, "s1", 0), WorkloadRequest(0.05, "completions", "a", 10, 13),
            WorkloadRequest(0.1, "chat", "a", 20, 3, "s1", 1)]
    seen: list[dict] = []

    async def main() -> list:
        srv = await _server(port, 0.2, seen)
        try:
            return await LoadRunner(reqs, {"a": f"http://127.0.0.1:{port}"}).run()
        finally:
            await srv.cleanup()

    res = asyncio.run(main())
    assert [r.status for r in res] == [200, 500, 200]
    assert [r.ok for r in res] == [True, False, True]
    assert res[0].chunks == 5 and res[0].server == "cell-x/0"  # 4 tokens + [DONE]
    assert all(r.latency_s >= 0.2 and r.ttft_s >= 0.2 for r in (res[0], res[2]))  # the server's 0.2 s is counted
    assert [s["path"] for s in seen] == ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions"]
    assert seen[0]["session"] == "s1" and seen[0]["stream"] is True and len(seen[0]["messages"][0]["content"]) == 40
    s = summarize(res)
    assert s["requests"] == 3 and s["ok"] == 2 and s["statuses"] == {"200": 2, "500": 1}
    write_results(res, tmp_path / "r.csv")
    rows = list(csv.DictReader((tmp_path / "r.csv").read_text().splitlines()))
    assert [row["status"] for row in rows] == ["200", "500", "200"]
    write_results(res, tmp_path / "r.jsonl")
    assert json.loads((tmp_path / "r.jsonl").read_text().splitlines()[1])["status"] == 500


def test_a_dead_target_is_an_error_result_not_a_crash() -> None:
    port = free_port()  # nothing listens
    res = asyncio.run(LoadRunner([WorkloadRequest(0.0, "chat", "", 5, 2)], {"": f"http://127.0.0.1:{port}"}, timeout_s=5).run())
    assert res[0].status == 0 and res[0].error and not res[0].ok


def test_the_cli_summary_of_a_run_with_no_success_says_why_instead_of_printing_nans(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    port = free_port()  # nothing listens
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    summary, rows = Path(tmp_path) / "s.json", Path(tmp_path) / "r.jsonl"
    out = subprocess.run([sys.executable, "-m", "dlb.cli", "load", "--url", f"http://127.0.0.1:{port}", "--rate", "5",
                          "--duration", "1", "--quiet", "--json", str(summary), "--out", str(rows)],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    # Files a user feeds to jq or a browser are strict JSON: nothing to measure is null, never NaN.
    def refuse(c: str) -> None:
        raise AssertionError(f"not strict JSON: {c}")

    assert json.loads(summary.read_text(), parse_constant=refuse)["mean_s"] is None
    assert all(json.loads(line, parse_constant=refuse)["error"] for line in rows.read_text().splitlines())
    assert "nan" not in out.stdout.lower(), out.stdout
    assert "latency mean - p50 -" in out.stdout, out.stdout
    assert "errors {'Client" in out.stdout, out.stdout  # the connection error's kind, e.g. ClientConnectorError


@pytest.mark.parametrize(("argv", "option"), [
    (["load", "--url", "http://127.0.0.1:1", "--rate", "0"], "--rate"),
    (["load", "--url", "http://127.0.0.1:1", "--duration", "-5"], "--duration"),
    (["demo", "--no-live", "--duration", "-5"], "--duration"),
    (["demo", "--no-live", "--load", "nan"], "--load"),
    (["demo", "--no-live", "--ready-timeout", "0"], "--ready-timeout"),
    (["load", "--url", "http://127.0.0.1:1", "--timeout", "-1"], "--timeout"),
    # `dlb up` started everything and stopped at once (--duration -5), or timed out before waiting (-1).
    (["up", "--config", "dlb.yaml", "--duration", "-5"], "--duration"),
    (["up", "--config", "dlb.yaml", "--ready-timeout", "-1"], "--ready-timeout"),
])
def test_a_bad_rate_or_duration_is_reported_against_the_option_typed(argv: list[str], option: str) -> None:
    """Was ``dlb load: rate_rps: must be > 0`` / ``dlb demo: duration_s: ...``: internal names a user never typed."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "dlb.cli", *argv], capture_output=True, text=True, env=env, timeout=60,
                         check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"argument {option}: must be a finite number > 0" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "_rps" not in out.stderr and "duration_s" not in out.stderr


def test_a_url_that_is_not_http_is_refused_by_name_before_sending(tmp_path: Path) -> None:
    """Was: ten requests, ten ``InvalidUrlClientError``s, and a summary as if the fleet had failed."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for url in ("notaurl", "us-east1=127.0.0.1:10000", "ftp://host:1"):
        out = subprocess.run([sys.executable, "-m", "dlb.cli", "load", "--url", url, "--duration", "1", "--quiet"],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"dlb load: --url {url}: not an http(s) URL" in out.stderr, out.stderr
        assert "requests over" not in out.stdout  # nothing was sent


def test_requests_cut_by_a_stop_are_left_out_of_the_summary_not_counted_as_failures() -> None:
    """Ctrl-C of ``dlb demo`` / ``dlb load`` cancels what is in flight: those requests say nothing about
    the system, so the success rate is that of the requests the run let finish."""
    port = free_port()
    reqs = [WorkloadRequest(0.0, "chat", "a", 10, 2), WorkloadRequest(0.0, "chat", "a", 10, 2, "slow")]

    async def main() -> list:
        async def handle(request: web.Request) -> web.Response:
            if request.headers.get("x-session-id") == "slow":
                await asyncio.sleep(30)
            return web.json_response({"choices": []})

        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)
        srv = web.AppRunner(app, access_log=None)
        await srv.setup()
        await web.TCPSite(srv, "127.0.0.1", port).start()
        stop = asyncio.Event()
        runner = LoadRunner(reqs, {"a": f"http://127.0.0.1:{port}"}, stream=False)
        task = asyncio.create_task(runner.run(stop))
        while not any(r.ok for r in runner.results):  # the fast one finished; the slow one is in flight
            await asyncio.sleep(0.02)
        stop.set()
        try:
            return await task
        finally:
            await srv.cleanup()

    res = asyncio.run(main())
    assert len(res) == 2 and sum(r.ok for r in res) == 1
    s = summarize(res)
    assert s["cut"] == 1 and s["requests"] == 1 and s["errors"] == 0 and s["success_rate"] == 1.0


def test_ctrl_c_says_the_run_was_interrupted_and_exits_130_not_as_a_finished_run() -> None:
    """Was: exit 0 (or 1 when nothing had finished), no word of the stop, the requests cut in flight only in
    ``--json``, and the offered rate divided by the whole planned duration (0.4/s for a 3/s run)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import threading

    from bounded_wait import until

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers: requests stay in flight
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "load", "--url", f"http://127.0.0.1:{port}", "--rate", "20",
                                 "--duration", "600", "--arrival", "constant"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
        reader.start()
        try:
            until(lambda: any("in flight" in ln and not ln.rstrip().endswith("in flight 0") for ln in lines),
                  "a progress line with requests in flight", timeout=120)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
    out = "".join(lines)
    assert rc == 130, out
    assert "dlb load: interrupted after" in out and "requests then in flight left out" in out, out
    assert "requests 0  ok 0" in out, out  # none finished: the cut ones are not counted as failures
