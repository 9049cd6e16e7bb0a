"""What a root that is not ready yet is waiting for, in words, from its and its leaves' ``/metrics``.

Why: ``dlb up`` calls a root ready only when it has fresh probe state for every cell it may send to
(:func:`dlb.launch.up.probes_fresh`; after a grace, a cell known to be down stops blocking:
:func:`blocking`). When a cell cannot become usable — every server of it down, a
leaf agent that does not answer — the console used to stay silent until the ready timeout and then
name only "root east service", while the reason sat in the metrics: the root's probe counters say
whether the leaf answers at all, and the leaf's ``dlb_leaf_healthy_servers`` whether it has a server.

Pure: metric texts in, a sentence out (the supervisor asks for it every few seconds; the I/O is in
:mod:`dlb.launch.up`).
"""

from __future__ import annotations

import json

from dlb.config.model import Config
from dlb.launch.metrics_text import metric_value


def unusable(root_metrics: str, cfg: Config, cell: str) -> dict[str, list[str]]:
    """Destination cell -> the endpoints for which the root of ``cell`` cannot use it yet (in config order)."""
    out: dict[str, list[str]] = {}
    for dest in cfg.allowed_destinations(cell):
        for ep in cfg.endpoints:
            if metric_value(root_metrics, "dlb_root_cell_usable", endpoint=ep.name, cell=dest.name) != 1.0:
                out.setdefault(dest.name, []).append(ep.name)
    return out


def joined(root_metrics: str, cfg: Config, cell: str, pending: set[str]) -> list[str]:
    """Of ``pending`` (cells the root of ``cell`` started without), those now usable for every endpoint."""
    still = unusable(root_metrics, cfg, cell)
    return sorted(d for d in pending if d not in still)


def known_down(root_metrics: str, cfg: Config, dest: str) -> bool:
    """The root hears the cell (a probe answer within ``stale_after_ms``) and it is still unusable: the cell
    says it cannot serve (no healthy server, drained) — an outage the root routes around, not a start-up race."""
    oks = metric_value(root_metrics, "dlb_root_probes_total", cell=dest) or 0.0
    age = metric_value(root_metrics, "dlb_root_probe_age_seconds", cell=dest)
    return oks > 0 and age is not None and age <= cfg.probe.stale_after_ms / 1000.0


def blocking(root_metrics: str, cfg: Config, cell: str, skip_down: bool) -> tuple[dict[str, list[str]], list[str]]:
    """(cells the root of ``cell`` still waits for -> endpoints, cells it may start without).

    Without ``skip_down`` every unusable cell blocks. With it (``dlb up`` after its grace), a cell
    :func:`known_down` no longer does, as long as every endpoint keeps a usable cell: a load balancer that
    would not start during one cell's outage fails exactly when it is needed, but one with nowhere to send
    an endpoint's requests is not ready."""
    waiting = unusable(root_metrics, cfg, cell)
    if not skip_down or not waiting:
        return waiting, []
    dests = [d.name for d in cfg.allowed_destinations(cell)]
    if any(all(ep.name in waiting.get(d, ()) for d in dests) for ep in cfg.endpoints):
        return waiting, []
    down = [d for d in waiting if known_down(root_metrics, cfg, d)]
    return {d: eps for d, eps in waiting.items() if d not in down}, down


def last_probe_failures(log_tail: str) -> dict[str, str]:
    """Cell -> the reason of the last ``probe_failed`` line in a root's JSON log (its tail): the metrics count
    failures but cannot say why, and a foreign cell's reason ("exports no pool metrics…") was only in the log."""
    out: dict[str, str] = {}
    for line in log_tail.splitlines():
        if '"probe_failed"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the tail's first line may be cut
        if isinstance(rec, dict) and rec.get("event") == "probe_failed" and "cell" in rec:
            out[str(rec["cell"])] = str(rec.get("reason", ""))
    return out


def cell_reason(root_metrics: str, cfg: Config, dest: str, leaf_metrics: str | None, last_error: str = "") -> str:
    """Why one destination cell is not usable: its leaf does not answer probes, or answers with no server.
    ``last_error``: the root's last probe failure for it (from its log), shown where the failures are the reason."""
    said = f"; last: {last_error}" if last_error else ""
    oks = metric_value(root_metrics, "dlb_root_probes_total", cell=dest) or 0.0
    errors = metric_value(root_metrics, "dlb_root_probe_errors_total", cell=dest) or 0.0
    age = metric_value(root_metrics, "dlb_root_probe_age_seconds", cell=dest)
    probe = cfg.cell(dest).leaf.probe
    if cfg.cell(dest).leaf.foreign:
        cell = cfg.cell(dest)
        where = cell.leaf.probe if cell.leaf.source == "gie" else ", ".join(cell.scrape_addresses()[:3])
        gateway = f", its gateway {cell.leaf.address} to accept connections" if cell.leaf.source == "gie" else ""
        return f"its metrics to answer{gateway} ({cell.leaf.source} cell: /metrics of {where}; {errors:.0f} scrapes failed{said})"
    if leaf_metrics is not None and metric_value(leaf_metrics, "dlb_leaf_envoy_reachable") == 0:
        return f"its leaf Envoy at {cfg.cell(dest).leaf.address} (its agent cannot reach it, so it refuses probes)"
    if oks == 0:
        failed = f", {errors:.0f} failed{said}" if errors else ""
        return f"its leaf agent's first probe answer ({probe}{failed})"
    stale_s = cfg.probe.stale_after_ms / 1000.0
    if age is not None and age > stale_s:
        return f"a fresh probe answer from its leaf agent ({probe}: last answer {age:.0f}s ago, {errors:.0f} failed)"
    healthy = None if leaf_metrics is None else metric_value(leaf_metrics, "dlb_leaf_healthy_servers")
    servers = [str(sv.address) for sv in cfg.cell(dest).servers]
    if healthy == 0:
        shown = ", ".join(servers[:3]) + (f" and {len(servers) - 3} more" if len(servers) > 3 else "")
        return f"a healthy server (its leaf reports 0 of {len(servers)} healthy: is {shown} running?)"
    return "its leaf to report it available"


def root_waiting(root_metrics: str, cfg: Config, cell: str, leaf_metrics: dict[str, str | None],
                 last_errors: dict[str, str] | None = None) -> str:
    """One line: every cell the root of ``cell`` may use but cannot yet, and why ("" when none)."""
    parts = []
    all_endpoints = [ep.name for ep in cfg.endpoints]
    errs = last_errors or {}
    for dest, endpoints in unusable(root_metrics, cfg, cell).items():
        scope = "" if endpoints == all_endpoints else f" for {', '.join(endpoints)}"
        parts.append(f"cell {dest}{scope}: {cell_reason(root_metrics, cfg, dest, leaf_metrics.get(dest), errs.get(dest, ''))}")
    return "usable cells — " + "; ".join(parts) if parts else ""
