"""``dlb up`` in front of a cell it does not run: envoy_configs/dlb.foreign.yaml (a DLB cell and a cell
of vLLM-style servers probed only through their ``/metrics``), real Envoys, emulated servers in their
own processes.

Rule: the foreign cell is routed to by its metrics as a DLB cell is by its leaf. Slowed 20×, its share
of the requests falls to half within 30 s and stays down; so does the DLB cell's when it is the slow
one, in the same run.
The share is the root's decisions (its ``dlb_root_decisions_total``): a router blind to the cells'
state (Rand) keeps deciding half and half while the slow cell's queue grows.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

import pytest
import yaml
from test_up import REPO, _read_until

from dlb.launch.supervisor import processes_of_run
from dlb.procutil import free_port
from dlb.testbed.emulator import EmulatorProcess
from dlb.testbed.stack import request

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(360)]

DEMO = REPO / "envoy_configs" / "dlb.foreign.yaml"
CLIENTS = 8
SLOWDOWN = 20.0
#: Emulated time, not the box's CPU, must set a request's latency (the box is shared: 8 tokens of 0.1-s
#: steps is ~1 s at full speed, ~20 s slowed, for a few ms of CPU; at load 40 the CPU alone took ~8 s).
TIME_SCALE, TOKENS = 50.0, 8
WINDOW_S = 8.0  # share measured over the root's decisions of the last WINDOW_S
BASELINE_S = 15.0
WITHIN_S = 30.0


def _config(servers: dict[str, list[str]]) -> dict:
    """The demo config with the emulators as servers and every other port drawn free."""
    cfg = yaml.safe_load(DEMO.read_text())
    for cell in cfg["cells"]:
        cell["servers"] = servers[cell["name"]]
    # A port left to its default (19901 for a root's admin) would collide with another test's run.
    cfg["services"]["root"].setdefault("admin", "127.0.0.1:19190")
    text = json.dumps(cfg)
    for port in sorted(set(re.findall(r'"127\.0\.0\.1:(\d+)"', text))):
        if not any(s.endswith(f":{port}") for ss in servers.values() for s in ss):
            text = text.replace(f'"127.0.0.1:{port}"', f'"127.0.0.1:{free_port()}"')
    return json.loads(text)


def _set_faults(emus: list[EmulatorProcess], **faults: float) -> None:
    for e in emus:
        req = urllib.request.Request(f"{e.admin_url}/admin/faults", data=json.dumps(faults).encode(), method="POST",
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()


class Threads:
    """Daemon threads started on ``with`` and stopped (``_stop`` set, joined) on leaving it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(70)


class Load(Threads):
    """``CLIENTS`` threads sending chats back to back, and the root's decisions per cell read every 0.5 s."""

    def __init__(self, host: str, port: int, root_metrics: str) -> None:
        super().__init__()
        self.host, self.port, self.root_metrics = host, port, root_metrics
        self.decisions: list[tuple[float, dict[str, float]]] = []
        self.errors: list[int] = []
        self.served = 0
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]
        self._threads.append(threading.Thread(target=self._sample, daemon=True))

    def _client(self) -> None:
        body = {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}
        while not self._stop.is_set():
            status, _, _ = request(self.host, self.port, body=body, timeout=60)
            if status == 200:
                self.served += 1
            else:
                self.errors.append(status)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            text = urllib.request.urlopen(self.root_metrics, timeout=5).read().decode()
            counts = {c: float(v) for c, v in re.findall(r'dlb_root_decisions_total\{cell="(\w+)",endpoint="chat"\} (\S+)', text)}
            self.decisions.append((time.monotonic(), counts))

    def share(self, cell: str, since: float, until: float) -> tuple[float, int]:
        """The fraction of the root's decisions in [since, until] that chose ``cell``, and how many there were."""
        inside = [(t, c) for t, c in list(self.decisions) if since <= t <= until]
        if len(inside) < 2:
            return 0.0, 0
        (_, a), (_, b) = inside[0], inside[-1]
        total = sum(b.values()) - sum(a.values())
        return ((b.get(cell, 0.0) - a.get(cell, 0.0)) / total if total else 0.0), int(total)

    def time_to_lose(self, cell: str, at: float, below: float) -> float | None:
        """Seconds after ``at`` until ``cell``'s share over the last ``WINDOW_S`` (≥ 8 decisions) first falls under ``below``."""
        t = at + WINDOW_S
        while t <= at + WITHIN_S + 1e-9:
            share, n = self.share(cell, t - WINDOW_S, t)
            if n >= 8 and share < below:
                return t - WINDOW_S / 2 - at  # the window's middle: when the share had fallen
            t += 0.5
        return None


@contextlib.contextmanager
def dlb_up(tmp_path: Path, cfg: dict) -> Iterator[tuple[Load, list[str]]]:
    """``dlb up`` on ``cfg`` with :class:`Load` on its root; stopped (and every process of the run gone) on exit."""
    run_dir = tmp_path / "run"
    (tmp_path / "dlb.yaml").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "up", "--config", str(tmp_path / "dlb.yaml"), "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        seen: list[str] = []
        m = _read_until(proc, r"root home: base_url http://([\d.]+):(\d+)/v1\s+metrics (\S+)", seen)
        _read_until(proc, r"Ctrl-C stops everything", seen)
        with Load(m.group(1), int(m.group(2)), m.group(3)) as load:
            yield load, seen
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in processes_of_run(run_dir):
            os.kill(pid, signal.SIGKILL)


def slow_cell(load: Load, emus: list[EmulatorProcess], cell: str) -> dict:
    """Slow ``cell``'s servers ``SLOWDOWN``× for ``WITHIN_S``, measure its share, then restore them and wait ``BASELINE_S``."""
    now = time.monotonic()
    before, n_before = load.share(cell, now - 10.0, now)
    _set_faults(emus, slowdown=SLOWDOWN)
    at = time.monotonic()
    time.sleep(WITHIN_S)
    after, n_after = load.share(cell, time.monotonic() - WINDOW_S, time.monotonic())
    result = {"share_before": round(before, 3), "share_last_window": round(after, 3), "seconds_to_half": load.time_to_lose(cell, at, before / 2),
              "decisions": (n_before, n_after)}
    _set_faults(emus, slowdown=1.0)
    time.sleep(BASELINE_S)  # both cells at full speed again before another is slowed
    return result


def check_lost_share(results: dict[str, dict], load: Load) -> None:
    for cell, r in results.items():
        assert r["share_before"] > 0.2, (cell, r)  # both cells used while both are fast
        assert r["seconds_to_half"] is not None, (cell, r)
        assert r["share_last_window"] < 0.75 * r["share_before"], (cell, r)  # and stays down while slow (few decisions: noisy)
    assert not load.errors, f"{len(load.errors)} requests failed: {sorted(set(load.errors))}"


def start_emulators(cells: tuple[str, ...], max_batch: int = 8) -> dict[str, list[EmulatorProcess]]:
    """Two emulated servers per cell, started side by side (a loaded box takes ~10 s for each Python start-up)."""
    emus = {cell: [EmulatorProcess(startup_timeout=120, server_id=f"{cell}/{k}", profile="fast-test", max_batch=max_batch, time_scale=TIME_SCALE)
                   for k in range(2)] for cell in cells}
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(EmulatorProcess.start, [e for es in emus.values() for e in es]))
    return emus


def test_a_slowed_foreign_cell_loses_its_share_within_30_s_as_a_dlb_cell_does(tmp_path: Path) -> None:
    emus: dict[str, list[EmulatorProcess]] = {}
    try:
        emus = start_emulators(("home", "partner"))
        with dlb_up(tmp_path, _config({c: [e.address for e in es] for c, es in emus.items()})) as (load, seen):
            assert not any("leaf partner" in line for line in seen), "dlb up started a leaf for the foreign cell"
            time.sleep(BASELINE_S)
            results = {slow: slow_cell(load, emus[slow], slow) for slow in ("partner", "home")}
            print("\nforeign-cell share of the root's decisions:", json.dumps(results), f"served {load.served}, failed {len(load.errors)}")
            check_lost_share(results, load)
    finally:
        for es in emus.values():
            for e in es:
                e.close()
