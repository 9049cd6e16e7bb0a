"""``dlb demo``: ``dlb up`` on an embedded emulated fleet, an open-loop workload, a live view, a report.

Sequence: start one emulator process per server (tier ``servers``), then the deployment exactly as
``dlb up`` does (:func:`dlb.launch.up.plan`: control plane, leaves, roots, Envoys over xDS, WAN
emulated), wait for every tier (roots: probes fresh), then send a seeded workload
(:mod:`dlb.load.workload`) at ``--load`` × the fleet's computed capacity through the roots. At
``DEGRADE_AT`` of the run the servers of the degraded cell slow down (``POST /admin/faults`` on each one's admin port) and
at ``RECOVER_AT`` they recover. Once a second the demo samples the control plane's ``/fleet`` (RIF,
errors, fitted models, aversion, flow weights) and the requests each root's Envoys sent each cell (share per
source); the live view (``rich``) or one plain line per 5 s (``--no-live``) shows them. At the end it
stops everything in order and writes the report (:mod:`dlb.testbed.report`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dlb.config.policy import set_plugins
from dlb.core.native_discrete import DEFAULT_PICK
from dlb.emulator.faults import Faults
from dlb.launch.supervisor import Child, StartError, Supervisor
from dlb.launch.up import StopFlag, http_ok, plan
from dlb.load.generator import CUT, LoadRunner
from dlb.load.workload import generate, with_phases
from dlb.procutil import free_port_block
from dlb.testbed.demo_run import BASELINE_WEIGHTS, DemoRun, Sample, native_label
from dlb.testbed.fleet import (
    DEFAULT_FLEET,
    CellPlan,
    Fleet,
    demo_config,
    server_addresses,
)
from dlb.testbed.scenarios import REQUEST_TIMEOUT_S, Scenario, plan_workload

DEGRADE_AT = 0.3  # fraction of the run at which the degraded cell slows down
RECOVER_AT = 0.55  # ... and recovers


def apply_policy(cfg: dict[str, Any], policy: str, native_pick: str = DEFAULT_PICK) -> None:
    """``policy`` (a DLB policy name) on every endpoint of ``cfg``. A ``-native`` one runs in the root Envoy
    with ``native_pick``, without affinity: an endpoint with affinity keeps the ext_proc, and the point
    of the native policies is the pick with none."""
    from dlb.core.costs import Cost
    from dlb.core.router import PolicyConfig

    core = PolicyConfig.from_name(policy.removesuffix("-native"))
    if policy.endswith("-native"):
        for ep in cfg["endpoints"]:
            ep["policy"] = {"plugins": [{"type": "native-discrete", "parameters": {"cost": core.cost.value, "pick": native_pick}}]}
        return
    for ep in cfg["endpoints"]:
        pol = ep.setdefault("policy", {})
        pol["mechanism"] = core.mechanism.value
        pol["cost"] = core.cost.value
        if core.cost is Cost.RIF and "affinity" in pol:
            pol["affinity"]["prefix_savings_ms"] = 0


def _policy_name(args: argparse.Namespace) -> str | None:
    """``--policy`` as the report names it: a native one with its pick."""
    if args.policy and args.policy.endswith("-native"):
        return native_label(args.policy, getattr(args, "native_pick", DEFAULT_PICK))
    return args.policy


def policy_label(cfg: dict[str, Any], source: str = "<demo>") -> str:
    """What routes each endpoint of ``cfg``, for the banner and the report: read from the config the run
    uses, so a ``--config`` file's own policies are what the report names."""
    from dlb.config import config_from_dict

    config = config_from_dict(cfg, source)
    if config.policy.weights in BASELINE_WEIGHTS.values() or config.policy.weights in ("rand", "mnlb"):
        return str(config.policy.weights)
    parts = []
    for ep in config.endpoints:
        core = ep.policy.to_core(config.probe)
        name = native_label(f"{core.name}-native", ep.policy.native_pick) if ep.policy.native else core.name
        parts.append(f"{ep.name} {name}{' + affinity' if core.affinity.enabled else ''}")
    return ", ".join(parts)


def _fleet_from_config(path: str) -> tuple[Fleet, dict[str, Any], dict[str, list[str]]]:
    import yaml

    from dlb.config import load_config

    cfg = load_config(path)  # validates; errors name file:line
    raw = yaml.safe_load(Path(path).read_text())
    cells = tuple(CellPlan(c.name, len(c.servers), "llama-8b-h100", root=c.root.address is not None) for c in cfg.cells)
    servers = {c.name: [str(s.address) for s in c.servers] for c in cfg.cells}
    degrade = cfg.cells[1].name if len(cfg.cells) > 1 else cfg.cells[0].name
    return Fleet(cells=cells, degrade_cell=degrade), raw, servers


def prepare(args: argparse.Namespace, run_dir: Path) -> tuple[DemoRun, Supervisor, str]:
    """Plan the run: servers, config, workload; the supervisor with every child added (none started)."""
    if args.duration is None:  # the CLI's default, resolved by _run_demo; callers of prepare may leave it unset
        args = argparse.Namespace(**{**vars(args), "duration": 60.0})
    if getattr(args, "dp", 0) < 0 or getattr(args, "dp", 0) == 1:
        raise ValueError(f"--dp: ranks per data-parallel server, >= 2 (0 = off), got {args.dp}")
    if args.config and getattr(args, "dp", 0):
        raise ValueError("--dp: only with the embedded fleet (give dp_ranks in your --config instead)")
    if args.config:
        fleet, cfg_dict, servers = _fleet_from_config(args.config)
    else:
        fleet = replace(DEFAULT_FLEET, dp_ranks=args.dp) if getattr(args, "dp", 0) else DEFAULT_FLEET
        servers = server_addresses(fleet)
        cfg_dict = demo_config(fleet, servers)
    if args.degrade_cell:
        fleet = replace(fleet, degrade_cell=args.degrade_cell)
    if fleet.degrade_cell not in servers:
        raise ValueError(f"--degrade-cell: no cell {fleet.degrade_cell!r} (cells: {', '.join(servers)})")
    if args.policy:
        apply_policy(cfg_dict, args.policy, getattr(args, "native_pick", DEFAULT_PICK))
    sc: Scenario | None = getattr(args, "scenario", None)
    spec, phases, capacity = plan_workload(fleet, sc, args.duration, args.seed, args.load)
    if sc is not None:
        sc.check(args.duration)
        window = sc.fault_window(args.duration)
    else:
        window = None if args.no_degrade else (DEGRADE_AT * args.duration, RECOVER_AT * args.duration)
    run = DemoRun(fleet=fleet, cfg_dict=cfg_dict, servers=servers, spec=spec, capacity=capacity,
                  degrade_cell=fleet.degrade_cell if window else None, degrade_window=window,
                  policy=_policy_name(args) or policy_label(cfg_dict, args.config or "<demo>"))
    run.phases = phases
    if sc is not None:
        run.fault = {"down": True} if sc.fault == "down" else None
        run.timeout_s = REQUEST_TIMEOUT_S
    sup = Supervisor(run_dir / "logs")
    py = [sys.executable, "-m", "dlb.cli"]
    profiles = {c.name: c.profile for c in fleet.cells}
    for cell, addrs in servers.items():
        # The emulator's default --host; a DP server's rank r serves its admin API on port + r.
        run.admin[cell] = [f"127.0.0.1:{free_port_block(fleet.ranks(cell))}" for _ in addrs]
        for k, addr in enumerate(addrs):
            port = addr.rpartition(":")[2]
            sup.add(Child(f"server {cell}/{k}", "servers",
                          [*py, "serve", "emulator", "--port", port, "--admin-port", run.admin[cell][k].rpartition(":")[2],
                           "--server-id", f"{cell}/{k}", "--profile", profiles[cell],
                           "--max-batch", str(fleet.max_batch), "--time-scale", str(fleet.time_scale),
                           "--seed", str(args.seed * 1000 + k),
                           *(["--dp-size", str(fleet.ranks(cell))] if fleet.ranks(cell) > 1 else [])],
                          sup.run_dir / f"server-{cell}-{k}.log",
                          ready=functools.partial(http_ok, f"http://{addr}/health")))
    # The leaves forget a past slowdown within the demo's time scale; MNLB comes from the control plane.
    weights = getattr(args, "weights", None)
    set_plugins(cfg_dict, {"type": "latency-fit", "parameters": {"window_s": fleet.fit_window_s,
                                                                 "refit_period_s": fleet.refit_period_s}},
                *([{"type": weights}] if weights else []))
    config_path = run_dir / "dlb.yaml"
    config_path.write_text(json.dumps(cfg_dict, indent=1))
    return run, sup, str(config_path.resolve())


async def _get_json(session: Any, url: str) -> Any:
    async with session.get(url) as r:
        return await r.json()


async def _get_text(session: Any, url: str) -> str:
    async with session.get(url) as r:
        return str(await r.text())


def _sent_by_cell(clusters_json: list[str], cell_of: dict[str, str]) -> dict[str, float]:
    """dest cell -> requests one root's Envoys sent there (their hosts' ``rq_total``, from each admin's
    ``/clusters?format=json``): the same count under every policy, whether a root service, the control
    plane's weights or an operator pool decided it; a host that is no cell's leaf is left out."""
    from dlb.envoy.host_health import requests_by_host

    out: dict[str, float] = {}
    for doc in clusters_json:
        for host, n in requests_by_host(doc).items():
            cell = cell_of.get(host)
            if cell is not None:
                out[cell] = out.get(cell, 0.0) + n
    return out


def sent_since(cur: dict[str, float], prev: dict[str, float]) -> dict[str, float]:
    """Per cell, what was sent since the previous sample: a counter that went back (its Envoy restarted)
    counts from zero, never as a negative share."""
    return {k: v - prev.get(k, 0.0) if v >= prev.get(k, 0.0) else v for k, v in cur.items()}


async def drive(run: DemoRun, sup: Supervisor, dep: Any, stop: StopFlag, live: bool) -> None:
    """Run the workload, the degradation schedule, sampling, the view and supervision until the end."""
    import aiohttp

    from dlb.testbed.view import PlainView, RichView

    reqs = with_phases(generate(run.spec), run.phases)
    targets = {cell: f"http://{info.base_url.split('//')[1].rsplit('/v1', 1)[0]}" for cell, info in dep.roots.items()}
    runner = LoadRunner(reqs, targets, timeout_s=run.timeout_s)
    done_stop = asyncio.Event()
    view: PlainView | RichView = RichView(run, sup.events) if live else PlainView(run)
    t0 = time.monotonic()
    last: dict[str, dict[str, float]] = {}
    fault_on = run.fault or {"slowdown": run.fleet.degrade_slowdown}
    defaults = asdict(Faults())
    fault_off = {k: defaults[k] for k in fault_on}
    degraded = False
    recovered = False
    # Where each root's Envoys sent requests: every leaf Envoy (replicas too) by address, each root's admins.
    cell_of = {str(r.address): c.name for c in dep.cfg.cells for r in c.leaf.all_replicas()}
    root_admins = {cell: [info.admin_url, *dep.more_root_admin.get(cell, [])] for cell, info in dep.roots.items()}

    async def set_faults(body: dict[str, Any]) -> None:
        assert run.degrade_cell is not None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            for addr in run.admin[run.degrade_cell]:
                async with s.post(f"http://{addr}/admin/faults", json=body) as r:
                    r.raise_for_status()

    load_task = asyncio.create_task(runner.run(done_stop))
    with view:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while not load_task.done():
                await asyncio.sleep(0.25)
                now = time.monotonic() - t0
                sup.poll()
                if stop():
                    run.interrupted = True
                    run.stopped_s = now
                    done_stop.set()
                    break
                if run.degrade_window and not degraded and now >= run.degrade_window[0]:
                    degraded = True
                    await set_faults(fault_on)
                    sup.say(f"cell {run.degrade_cell}", f"degraded: {fault_on}")
                if run.degrade_window and degraded and not recovered and now >= run.degrade_window[1]:
                    recovered = True
                    await set_faults(fault_off)
                    sup.say(f"cell {run.degrade_cell}", "recovered")
                if run.samples and now - run.samples[-1].t < 1.0:
                    continue
                try:
                    fleet = await _get_json(s, f"{dep.status_url}/fleet")
                    dec: dict[str, dict[str, float]] = {}
                    for cell, admins in root_admins.items():
                        cur = _sent_by_cell([await _get_text(s, f"{a.rstrip('/')}/clusters?format=json") for a in admins], cell_of)
                        dec[cell] = sent_since(cur, last.get(cell, {}))
                        last[cell] = cur
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    continue  # a restarting component: skip this sample
                okn = sum(1 for r in runner.results if r.ok)
                run.samples.append(Sample(now, fleet, dec, len(runner.results), okn))
                view.update(run.samples[-1], runner)
        if not load_task.done():
            done_stop.set()
        run.results = await load_task


def run_once(args: argparse.Namespace, out: Path, stop: StopFlag, live: bool, policy: str | None,
             degrade: bool, quiet: bool = False) -> tuple[DemoRun | None, int]:
    """One clean deployment, one workload, report in ``out``; returns the run and an exit code.

    ``policy`` "Rand" runs Rand on the real data path: both endpoints flow, no root services (Envoy
    takes its fail-open route, the control plane's weighted_clusters) and the control plane's
    weights frozen at the replica split (``--no-probe``). "MNLB" runs the same way with the control
    plane solving the central LP every 10 s from demand and capacity it measures (the ``mnlb`` policy plugin);
    the operator baselines too, each its own ``weights`` plugin (:data:`BASELINE_WEIGHTS`).
    """
    from dlb.config import ConfigError, load_config

    out.mkdir(parents=True, exist_ok=True)
    baseline = policy in BASELINE_WEIGHTS  # Envoy-native routing from the control plane, no root service
    weights = BASELINE_WEIGHTS.get(policy) if policy else None
    one = argparse.Namespace(**{**vars(args), "policy": "Flow-RIF" if baseline else policy, "no_degrade": not degrade,
                                "weights": weights})
    try:
        run, sup, config_path = prepare(one, out)
        cfg = load_config(config_path)
    except (ConfigError, ValueError, OSError) as e:
        print(f"dlb demo: {e}", file=sys.stderr)
        return None, 2
    if baseline and policy is not None:
        run.policy = policy
    sup.quiet = quiet
    n_servers = sum(len(v) for v in run.servers.values())
    print(f"dlb demo: {len(run.servers)} cells, {n_servers} emulated servers, capacity {sum(run.capacity.values()):.1f} req/s, "
          f"load {args.load:.0%} = {run.spec.rate_rps:.1f} req/s for {args.duration:.0f}s, policy {run.policy}, "
          f"degradation {'on' if degrade else 'off'}; logs in {sup.run_dir}", flush=True)
    # Rand and the pool baselines read no probe: the control plane need not send any.
    no_probe = policy in ("Rand", "lr-global", "locality-failover")
    dep = plan(cfg, config_path, sup, emulate_wan=True, control_plane_args=["--no-probe"] if no_probe else None,
               root_services=not baseline)
    code = 0
    try:
        sup.start(args.ready_timeout, should_stop=stop)
        if not quiet:
            print("dlb demo: every tier ready\n" + dep.urls_text(), flush=True)
        sup.quiet = live or quiet  # the live view shows state changes itself
        asyncio.run(drive(run, sup, dep, stop, live))
    except KeyboardInterrupt:
        run.interrupted = True
    except StartError as e:
        print(f"dlb demo: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the ordered stop
        sup.quiet = quiet
        t0 = time.monotonic()
        sup.stop()
        print(f"dlb demo: stopped every process in {time.monotonic() - t0:.1f}s", flush=True)
        stop.install()
    run.events = sup.events
    if run.interrupted:
        cut = sum(1 for r in run.results if r.error == CUT)
        after = f" after {run.stopped_s:.0f}s of load" if run.stopped_s is not None else ""
        print(f"dlb demo: interrupted{after}: {cut} requests then in flight left out of the figures", flush=True)
    if run.results:
        from dlb.testbed.report import write_report

        summary = write_report(run, out)
        if not quiet:
            print(summary, flush=True)
        print(f"report: {out / 'report.md'}", flush=True)
    return run, (130 if run.interrupted else code)
