"""``dlb bfio dataplane``: BF-IO vs JSQ rank picking on the real data path.

One cell whose server is a data-parallel emulator (``dlb serve emulator --dp-size G``, rank r on
``PORT+r``), the leaf agent (``dlb serve leaf``, the server's ``dp_ranks``/``policy``/``horizon`` in the
config) as the leaf Envoy's ext_proc, and the leaf Envoy itself. Clients send completions straight to
the leaf Envoy (no root: the question is the rank pick inside one server). For each policy a fresh
emulator, leaf and Envoy run the same seeded request list: prompt sizes lognormal (the leaf estimates
them from ``content-length``), decode lengths geometric (``max_tokens``; the leaf does not see them),
open-loop Poisson arrivals near the group's capacity (so ranks often have free slots to choose among).

Reported per policy: the emulator's barrier idle fraction (Σ ``dlb_dp_idle_seconds_total`` /
Σ (idle + busy) over the ranks, profile seconds), generated tokens per wall second, mean and p90
request latency, how many requests each rank got. Everything runs on 127.0.0.1, bounded in requests.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import math
import os
import random
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlb.bench import harness
from dlb.config import config_from_dict
from dlb.config.policy import set_plugins
from dlb.envoy.binary import EnvoyProcess
from dlb.envoy.bootstrap import leaf_bootstrap, write_bootstrap
from dlb.testbed.emulator import EmulatorProcess
from dlb.testbed.process import ServiceProcess, free_port


def _metrics(url: str, attempts: int = 4) -> str:
    """A /metrics page; a loaded box (load average 30+ on 2 cores) can take longer than one timeout."""
    for k in range(attempts):
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
                return r.read().decode()
        except OSError:
            if k == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _sum_metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name:
                total += float(value)
    return total


def rank_totals(ports: list[int], pool: ThreadPoolExecutor | None = None) -> dict[str, float]:
    """Σ over ranks of idle / busy seconds and generated tokens, read from every rank's /metrics
    (all at once with ``pool``: one sample then spans one scrape, not G of them)."""
    out = {"idle": 0.0, "busy": 0.0, "tokens": 0.0}
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for text in (pool.map(_metrics, urls) if pool is not None else map(_metrics, urls)):
        out["idle"] += _sum_metric(text, "dlb_dp_idle_seconds_total")
        out["busy"] += _sum_metric(text, "dlb_dp_busy_seconds_total")
        out["tokens"] += _sum_metric(text, "vllm:generation_tokens_total")
    return out


def workload(n: int, seed: int, prompt_median_tokens: float, mean_decode: float) -> list[tuple[int, int]]:
    """(prompt characters, max_tokens) per request, seeded: the same list for every policy."""
    rng = np.random.default_rng(seed)
    tokens = np.clip(rng.lognormal(math.log(prompt_median_tokens), 0.8, n), 8, 6000)
    decode = rng.geometric(1.0 / mean_decode, n)
    return [(int(t) * 4, int(d)) for t, d in zip(tokens, decode, strict=False)]


def streamed_tokens(body: bytes) -> int:
    """Tokens a client received in an SSE completion: its text events (the usage event and [DONE] aside)."""
    n = 0
    for line in body.split(b"\n"):
        if line.startswith(b"data: {") and b'"choices":[]' not in line:
            n += 1
    return n


def drive(host: str, port: int, reqs: list[tuple[int, int]], rate: float, seed: int, timeout_s: float,
          stream: bool = False) -> dict[str, Any]:  # fmt: skip
    """Open-loop Poisson arrivals at ``rate``/s (seeded), one connection per request; returns latencies,
    statuses, which rank served each request and (``stream``: SSE with usage) the tokens clients received.
    Open loop, not closed: a closed loop refills exactly the slot that just freed, which leaves a rank
    picker no choice to make."""
    lock = threading.Lock()
    lat: list[float] = []
    statuses: dict[int, int] = {}
    served: dict[str, int] = {}
    received = [0]
    gaps = np.random.default_rng(seed + 7).exponential(1.0 / rate, len(reqs))
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}

    def one(chars: int, max_tokens: int) -> None:
        body = json.dumps({"model": "dlb-emulated", "prompt": "x" * chars, "max_tokens": max_tokens, **extra}).encode()
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        t0 = time.monotonic()
        tokens = 0
        try:
            conn.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            status, server = resp.status, resp.getheader("x-dlb-server") or ""
            tokens = streamed_tokens(data) if stream and status == 200 else 0
        except (OSError, http.client.HTTPException):
            status, server = 0, ""
        finally:
            conn.close()
        with lock:
            statuses[status] = statuses.get(status, 0) + 1
            received[0] += tokens
            if status == 200:
                lat.append(time.monotonic() - t0)
                served[server] = served.get(server, 0) + 1

    t0 = time.monotonic()
    # One thread per request: a smaller pool would hold the backlog in the client, FIFO, where neither the
    # leaf's hold queue nor its policy sees it (at 256 threads a G = 8, B = 32 group was never above capacity).
    with ThreadPoolExecutor(max_workers=max(1, len(reqs))) as pool:
        at = t0
        for (chars, max_tokens), gap in zip(reqs, gaps, strict=False):
            at += float(gap)
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, chars, max_tokens)
    return {"wall_s": time.monotonic() - t0, "latencies": lat, "statuses": statuses, "served": served,
            "tokens_received": received[0]}


@dataclass
class DpCell:
    """A running DP cell: the leaf Envoy clients talk to, the ranks' ports, the leaf agent's metrics."""

    leaf: tuple[str, int]
    rank_ports: list[int]
    leaf_metrics_url: str
    envoy_admin: int = 0
    leaf_pid: int = 0

    def wait_scraped(self, ranks: int, timeout_s: float = 120.0) -> None:
        """Until the leaf has scraped every rank once: before that it does not know the ranks' admission
        bound, and a burst sent then is not held (on a box at load 30+ the first scrapes time out)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                loads = [float(line.rpartition(" ")[2]) for line in self.leaf_metrics().splitlines()
                         if line.startswith("dlb_leaf_server_scraped_load{")]  # fmt: skip
                if len(loads) >= ranks and min(loads) >= 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the leaf did not scrape all {ranks} ranks within {timeout_s} s")

    def leaf_cpu_s(self) -> float:
        """CPU seconds the leaf agent's process has used (user + system)."""
        fields = Path(f"/proc/{self.leaf_pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def envoy_stat(self, name: str) -> float:
        """One counter of the leaf Envoy's admin /stats (0 if absent)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.envoy_admin}/stats?filter=^{name}$", timeout=30) as r:
            text = r.read().decode()
        return float(text.rpartition(":")[2]) if ":" in text else 0.0

    def leaf_metrics(self) -> str:
        with urllib.request.urlopen(self.leaf_metrics_url, timeout=30) as r:
            return r.read().decode()


@contextlib.contextmanager
def dp_cell(policy: str, *, dp_size: int, max_batch: int, horizon: int = 10, mean_decode: float = 32.0,
            max_num_seqs: int | None = None, time_scale: float = 1.0, seed: int = 1,
            background_probes: bool = True, hold_queue: int = 0, hold_deadline_ms: float = 5000.0,
            stream_tokens: bool = True) -> Iterator[DpCell]:  # fmt: skip
    """Start a DP emulator (``--dp-size``), the leaf agent with the group's policy and a real leaf Envoy.

    ``background_probes=False`` turns off the leaf's own probe requests, for tests that place requests
    one by one and check where each lands (a warm-up probe still in flight is a resident too).
    ``hold_queue`` > 0: the leaf holds requests while every rank is at the bound the ranks report
    (``max_num_seqs`` then stays unset in the config unless given: the bound is the ranks' own).
    ``stream_tokens=False`` leaves out the leaf Envoy's stream token count (BF-IO then estimates decoded
    tokens from elapsed time between the ranks' reports).
    """
    with tempfile.TemporaryDirectory(prefix="dlb-bfio-dp-") as tmp, \
            EmulatorProcess(server_id="dp", profile="fast-test", dp_size=dp_size, max_batch=max_batch,
                            max_queue=10_000, time_scale=time_scale, seed=seed) as emu:  # fmt: skip
        server: dict[str, Any] = {"address": f"127.0.0.1:{emu.port}", "dp_ranks": dp_size, "policy": policy,
                                  "horizon": horizon, "mean_decode_tokens": mean_decode,
                                  "max_num_seqs": (0 if hold_queue else max_batch) if max_num_seqs is None else max_num_seqs}  # fmt: skip
        if hold_queue:
            server.update(hold_queue=hold_queue, hold_deadline_ms=hold_deadline_ms)
        raw = {
            "version": 1,
            "cells": [{
                "name": "dp",
                "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}",
                         "ext_proc": f"127.0.0.1:{free_port()}"},
                "servers": [server],
            }],
            "endpoints": [{"name": "gen", "match": {"prefix": "/v1/"}}],
        }  # fmt: skip
        # 64 choices: the leaf's pick sees every server, so the DP group's own policy decides the rank.
        set_plugins(raw, {"type": "prequal", "parameters": {"choices": 64}},
                    *(() if background_probes else ({"type": "background-probe", "parameters": {"min_interval_ms": 0}},)))
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(raw, indent=1))
        cfg = config_from_dict(raw, source=str(path))
        metrics_port = free_port()
        with ServiceProcess("leaf", "--config", str(path), "--cell", "dp", "--metrics", f"127.0.0.1:{metrics_port}",
                            "--seed", str(seed)) as agent:
            admin = free_port()
            boot = write_bootstrap(leaf_bootstrap(cfg, "dp", admin_port=admin, emulate_wan=False, access_log=True,
                                                  stream_tokens=stream_tokens),
                                   Path(tmp) / "leaf.yaml")  # fmt: skip
            with EnvoyProcess(boot, admin, base_id=random.randrange(1, 60000)):
                leaf = cfg.cell("dp").leaf.address
                cell = DpCell((leaf.host, leaf.port), [emu.port + r for r in range(dp_size)],
                              f"http://127.0.0.1:{metrics_port}/metrics", admin, agent.proc.pid if agent.proc else 0)  # fmt: skip
                if hold_queue:
                    cell.wait_scraped(dp_size)
                yield cell


@dataclass(frozen=True)
class DataplaneRun:
    """One ``dlb bfio dataplane`` run of a policy: the DP group, the workload and how long it may take."""

    dp_size: int
    max_batch: int
    requests: int
    rate: float
    seed: int
    horizon: int
    mean_decode: float
    prompt_median_tokens: float
    time_scale: float
    timeout_s: float = 300.0
    hold_queue: int = 0  # > 0: the leaf holds requests above the ranks' admission bound
    hold_deadline_ms: float = 60_000.0
    stream: bool = False  # clients ask for SSE streams (with usage)
    stream_tokens: bool = True  # the leaf counts decoded tokens from the streams


class BacklogSampler:
    """Samples the ranks' idle/busy counters and the leaf's held count every ``period_s`` during a run.

    Why: the step-exact study measures idle *while the group has a backlog*; a bounded data-path run
    also drains (no arrivals, ranks emptying one by one), and at G = 8 that drain was ~3/4 of the
    step time, so the whole-run idle fraction mostly measured the drain. The backlog phase here is
    every sampling interval that starts and ends with requests held at the leaf.
    """

    def __init__(self, cell: DpCell, period_s: float = 0.5) -> None:
        self.cell, self.period_s = cell, period_s
        self.samples: list[tuple[float, float, float]] = []  # (held, idle, busy)
        self.times: list[float] = []  # seconds since the sampler started, per sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="backlog-sampler", daemon=True)

    def _loop(self) -> None:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(self.cell.rank_ports) + 1) as pool:
            while not self._stop.is_set():
                try:
                    leaf = pool.submit(self.cell.leaf_metrics)
                    tot = rank_totals(self.cell.rank_ports, pool)
                    held = _sum_metric(leaf.result(), "dlb_leaf_dp_held")
                except OSError:  # a scrape timed out on a loaded box: skip the sample, the next interval is longer
                    continue
                self.samples.append((held, tot["idle"], tot["busy"]))
                self.times.append(time.monotonic() - t0)
                self._stop.wait(self.period_s)

    def __enter__(self) -> BacklogSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        """Idle fraction over the backlog phase, that phase's share of all step time, the most held."""
        idle = busy = all_ = 0.0
        for (h0, i0, b0), (h1, i1, b1) in itertools.pairwise(self.samples):
            all_ += (i1 - i0) + (b1 - b0)
            if h0 > 0 and h1 > 0:
                idle, busy = idle + i1 - i0, busy + b1 - b0
        return {"idle_frac_backlog": idle / (idle + busy) if idle + busy > 0 else math.nan,
                "backlog_share": (idle + busy) / all_ if all_ > 0 else 0.0,
                "max_held": max((h for h, _, _ in self.samples), default=0.0)}


def run_policy(policy: str, run: DataplaneRun) -> dict[str, Any]:
    """One policy end to end on fresh processes; returns the measured record."""
    dp_size, max_batch, requests, rate, seed = run.dp_size, run.max_batch, run.requests, run.rate, run.seed
    horizon, mean_decode, prompt_median_tokens, time_scale, timeout_s = (
        run.horizon, run.mean_decode, run.prompt_median_tokens, run.time_scale, run.timeout_s)
    with dp_cell(policy, dp_size=dp_size, max_batch=max_batch, horizon=horizon, mean_decode=mean_decode,
                 time_scale=time_scale, seed=seed, hold_queue=run.hold_queue,
                 hold_deadline_ms=run.hold_deadline_ms, stream_tokens=run.stream_tokens) as cell:  # fmt: skip
        before = rank_totals(cell.rank_ports)
        cpu0 = cell.leaf_cpu_s()
        with BacklogSampler(cell) as sampler:
            out = drive(*cell.leaf, workload(requests, seed, prompt_median_tokens, mean_decode), rate, seed, timeout_s,
                        stream=run.stream)  # fmt: skip
        after = rank_totals(cell.rank_ports)
        leaf_cpu_s = cell.leaf_cpu_s() - cpu0  # the sampler's scrapes of the leaf are in it too
        chunks = cell.envoy_stat("http.dlb_leaf.ext_proc.dlb_leaf_tokens.stream_msgs_sent")
        leaf_metrics = cell.leaf_metrics()
    idle = after["idle"] - before["idle"]
    busy = after["busy"] - before["busy"]
    lat = out["latencies"]
    return {
        "policy": policy, "G": dp_size, "B": max_batch, "H": horizon if policy == "bf-io" else None,
        "requests": requests, "rate": rate, "ok": len(lat), "statuses": out["statuses"],
        "idle_frac": idle / (idle + busy) if idle + busy > 0 else 0.0,
        "throughput_tok_s": (after["tokens"] - before["tokens"]) / out["wall_s"],
        # Tokens per second of emulated stepping (profile time): the group's speed, free of how busy the
        # machine running the emulator was (Σ(idle + busy) over ranks = G × the steps' total time).
        "throughput_tok_per_step_s": (after["tokens"] - before["tokens"]) / ((idle + busy) / dp_size) if idle + busy else 0.0,
        # The paper's energy measure up to the power draw: G × Σ step time (GPU-seconds of the profile).
        "energy_proxy_gpu_s": idle + busy,
        **sampler.summary(),
        "samples": [[round(t, 3), *x] for t, x in zip(sampler.times, sampler.samples, strict=True)],
        "mean_s": float(np.mean(lat)) if lat else math.nan,
        "p90_s": float(np.percentile(lat, 90)) if lat else math.nan,
        "wall_s": out["wall_s"], "served_by": dict(sorted(out["served"].items())),
        "leaf_dp_ranks_tracked": leaf_metrics.count("dlb_leaf_dp_rank_kv_tokens{"),
        "stream": run.stream, "stream_tokens": run.stream_tokens, "tokens_received": out["tokens_received"],
        "leaf_counted_tokens": _sum_metric(leaf_metrics, "dlb_leaf_dp_stream_tokens_total"),
        "leaf_cpu_s": leaf_cpu_s, "stream_messages": chunks,
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    record = harness.start()
    records = []
    for seed, policy in itertools.product(args.seeds, args.policies):
        rec = run_policy(policy, DataplaneRun(dp_size=args.dp_size, max_batch=args.max_batch, requests=args.requests,
                                              rate=args.rate, seed=seed, horizon=args.horizon,
                                              mean_decode=args.mean_decode, prompt_median_tokens=args.prompt_median,
                                              time_scale=args.time_scale, hold_queue=args.hold,
                                              hold_deadline_ms=args.hold_deadline_ms, stream=args.stream,
                                              stream_tokens=args.stream_tokens))  # fmt: skip
        rec["seed"] = seed
        records.append(rec)
        print(f"seed={seed} {policy:12} idle={rec['idle_frac']:.4f} thr={rec['throughput_tok_s']:.0f} tok/s wall "
              f"{rec['throughput_tok_per_step_s']:.0f} tok/s stepping mean={rec['mean_s']:.3f}s "
              f"p90={rec['p90_s']:.3f}s backlog_idle={rec['idle_frac_backlog']:.4f} (share {rec['backlog_share']:.2f}, "
              f"max held {rec['max_held']:.0f}) energy={rec['energy_proxy_gpu_s']:.1f} GPU-s "
              f"ok={rec['ok']}/{rec['requests']} served_by={rec['served_by']} leaf_cpu={rec['leaf_cpu_s']:.2f}s "
              f"counted={rec['leaf_counted_tokens']:.0f}/{rec['tokens_received']} in {rec['stream_messages']:.0f} messages",
              flush=True)  # fmt: skip
    doc = {"command": "dlb bfio dataplane", "args": {k: v for k, v in vars(args).items() if k != "func"}, "records": records}
    return harness.finish(record, doc, json_path=args.json)
