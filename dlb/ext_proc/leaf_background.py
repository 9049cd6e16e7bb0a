"""The leaf's work off the request path: refit the latency model, scrape the servers' queue gauges,
check its own leaf Envoy, and send background probe requests when the cell is idle.

Scrapes poll each server's ``/metrics`` (vLLM gauges ``vllm:num_requests_running`` /
``vllm:num_requests_waiting``); the refit runs in a worker thread; background probes
(:mod:`dlb.core.background`) are real inference requests POSTed to this cell's own leaf Envoy, so they
take the data path real traffic takes (leaf Envoy → this agent's server pick → a server → the access
log). A refusal (4xx but 429) is never a latency sample (:meth:`LeafState.complete`), so a probe the
servers reject (a wrong ``model``, too many ``max_tokens``) only counts as failed and says why in the log.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable

from dlb.config.model import BackgroundProbeParams
from dlb.core.background import BackgroundProbeConfig, BackgroundProber, capacity_floor, surprise
from dlb.core.latency_model import latency
from dlb.envoy.contract import LEAF_SERVERS_CLUSTER
from dlb.envoy.host_health import hosts_out
from dlb.ext_proc.leaf_als import BACKGROUND_PROBE_ID
from dlb.ext_proc.leaf_state import LeafState
from dlb.log import get_logger
from dlb.probe.scrape import ScrapeSlow, http_get, scrape_vllm

log = get_logger("dlb.leaf")


class LeafBackground:
    """The background loops of one leaf and what they measured (exported as metrics)."""

    def __init__(self, state: LeafState, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.clock = clock
        self.fits = 0
        self.fit_seconds = 0.0
        #: True while the agent stops: its Envoy going away then is the plan, said at info, not warning (a
        #: stranger's every clean Ctrl-C left two warnings per leaf for alerts to fire on).
        self.stopping: Callable[[], bool] = lambda: False
        #: Whether this cell's leaf Envoy accepts connections (see :meth:`envoy_check_loop`).
        self.envoy_ok = True
        self.envoy_check_failures = 0
        #: Background probes (None until :meth:`background_loop` runs or while they are off) and their outcomes.
        self.prober: BackgroundProber | None = None
        #: The ``background-probe`` plugin's settings in force; :meth:`set_background` changes them live.
        self.bg_config: BackgroundProbeConfig | None = None
        self.bg_body = b""
        self.bg_ok = 0
        self.bg_failed = 0
        self._bg_failed_logged_at = 1  # the failure count at which the next warning is due (reset by new settings)
        self.bg_seconds = 0.0
        self._bg_tasks: set[asyncio.Task] = set()
        #: Set when background probes declared the cell changed: the fit loop refits at once.
        self.refit_now = False
        #: Declared changes by (source, direction), a metric: probes declaring a steady cell "faster" again and
        #: again are shorter than its traffic (see ``dlb_leaf_cell_changes`` in docs/data-plane.md).
        self.changes: dict[tuple[str, str], int] = {(s, d): 0 for s in ("probes", "traffic") for d in ("faster", "slower")}

    async def fit_loop(self) -> None:
        """Refit the latency model every ``refit_period_s`` in a worker thread.

        The fit (scipy least squares) takes milliseconds; running it on the event loop would stall
        every request the leaf is picking for. We refit a :meth:`~LatencyEstimator.detached` copy, then
        publish the result.
        """
        est = self.state.estimator
        loop = asyncio.get_running_loop()
        last = self.clock()
        while True:
            await asyncio.sleep(min(0.05, est.config.refit_period_s))
            now = self.clock()
            # Refit on schedule, or at once when the first samples can replace the configured prior
            # (a fresh or restarted leaf: its warm-up probes just completed).
            first = est.prior_measurable()
            t_change = est.take_change()  # the traffic's own samples say the cell changed (dlb.core.change)
            if t_change is not None:
                self.refit_now = True
                det = est.detector
                direction = "faster" if det is not None and det.last_sign < 0 else "slower"
                self.changed("traffic", direction, since_s_ago=round(now - t_change, 3))
            if now - last < est.config.refit_period_s and not first and not self.refit_now:
                continue
            last, self.refit_now = now, False
            try:
                self.state.expire(now)
                shadow = est.detached()
                t0 = time.perf_counter()
                await loop.run_in_executor(None, shadow.refit, now, self.state.running(now))
                self.fit_seconds += time.perf_counter() - t0
                self.fits += 1
                est.adopt(shadow, now)
            except Exception:
                log.exception("fit_failed", cell=self.state.cell)

    async def scrape_loop(self, period_s: float, timeout_s: float) -> None:
        """Poll every server's Prometheus ``/metrics`` for vLLM queue gauges."""
        while True:
            started = self.clock()
            results = await asyncio.gather(*(scrape_vllm(s.address, timeout_s) for s in self.state.servers),
                                           return_exceptions=True)
            for i, r in enumerate(results):
                if isinstance(r, ScrapeSlow):
                    self.state.on_scrape_slow(i)
                elif isinstance(r, BaseException):
                    raise r
                else:
                    self.state.on_scrape(i, r.running, r.waiting, r.kv_usage, now=self.clock(), admit_limit=r.admit_limit,
                                         kv_tokens=r.kv_tokens)
            await asyncio.sleep(max(0.0, period_s - (self.clock() - started)))

    def set_background(self, config: BackgroundProbeConfig | None, body: bytes) -> None:
        """New background-probe settings (the config over xDS): the running loop uses them from its next
        tick. The schedule's state (probes sent, surprises, a declared change) is kept, so a settings
        change does not look like a restart; ``None`` turns probing off."""
        self.bg_config, self.bg_body = config, body
        self._bg_failed_logged_at = self.bg_failed + 1  # new settings: their first failure is said, whatever came before
        if config is None:
            self.prober = None
        elif self.prober is not None:
            self.prober.config = config

    async def background_loop(self, address: str, config: BackgroundProbeConfig | None, body: bytes, tick_s: float = 0.25) -> None:
        """Send one background probe request through this cell's leaf Envoy whenever the rule says so.

        The rule (:class:`BackgroundProber`) watches the cell's completions: a cell with traffic never
        probes; an idle one probes within its capacity budget, and a new leaf warms up at once. Each
        probe runs as its own task, so a slow server never delays the loop or the request path. The
        loop runs while probing is off too, so :meth:`set_background` can turn it on without a restart.
        """
        self.set_background(config, body)
        seq = 0
        watching = False  # as last logged: a cell well below its best capacity, probed every watch interval
        while True:
            await asyncio.sleep(tick_s)
            cfg = self.bg_config
            if cfg is None:
                continue
            prober = self.prober
            if prober is None:
                prober = self.prober = BackgroundProber(cfg)
            now = self.clock()
            while self.envoy_ok and self.probe_due(prober, now):
                prober.on_sent(now)
                seq += 1
                task = asyncio.create_task(self._background_probe(address, self.bg_body, f"{BACKGROUND_PROBE_ID}{os.getpid()}-{seq}",
                                                                  cfg.timeout_s))
                self._bg_tasks.add(task)
                task.add_done_callback(self._bg_tasks.discard)
            if prober.watching != watching:
                watching = prober.watching
                p = self.state.estimator.params
                log.info("cell_watched" if watching else "cell_watch_ended", cell=self.state.cell,
                         capacity_rps=round(capacity_floor(self.state.healthy(now), p.a, p.b), 3),
                         best_capacity_rps=round(prober.best_capacity, 3))

    def probe_due(self, prober: BackgroundProber, now: float) -> bool:
        """Ask ``prober`` with this cell's state: silence counted from the last request *started* (the
        slow tail a cell still completes after the roots left it is not traffic), capacity from the
        published model over the healthy servers, remembered only once the model is measured."""
        st = self.state
        p = st.estimator.params
        return prober.due(now, st.started, capacity_floor(st.healthy(now), p.a, p.b), st.estimator.measured)

    async def _background_probe(self, address: str, body: bytes, request_id: str, timeout_s: float) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        p = self.state.estimator.params
        predicted = float(latency(self.state.rif + 1, p.a, p.b, p.c, p.s))
        t0 = self.clock()
        status = 0
        raw = b""
        writer = None
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: " + address.encode() +
                         b"\r\ncontent-type: application/json\r\nconnection: close\r\nx-request-id: " +
                         request_id.encode() + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            async with asyncio.timeout(timeout_s):
                raw = await reader.read(-1)
            line = raw.split(b"\r\n", 1)[0].split()
            status = int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/1.") else 0
        except (TimeoutError, OSError, ValueError):
            status = 0
        finally:
            if writer is not None:
                writer.close()
        elapsed = self.clock() - t0
        surprised = 0
        if 200 <= status < 300:
            self.bg_ok += 1
            self.bg_seconds += elapsed
        else:
            self.bg_failed += 1
            if self.bg_failed >= self._bg_failed_logged_at:
                self._bg_failed_logged_at = self.bg_failed + 100
                # The server's own words (first 200 bytes of the body): "model does not exist", "maximum context
                # length" name the plugin setting to fix; JSON logging escapes whatever a server sends.
                reason = raw.partition(b"\r\n\r\n")[2][:200].decode("utf-8", "replace") if status else "no response"
                log.warning("background_probe_failed", cell=self.state.cell, status=status, failed=self.bg_failed, reason=reason,
                            hint="a 4xx names a background-probe setting the servers refuse (model, max_tokens)"
                            if 400 <= status < 500 else "")
        pr = self.prober
        if pr is not None:
            if 200 <= status < 300:
                surprised = surprise(elapsed, predicted, pr.config.tolerance)
            pr.on_done(self.clock(), surprised)
            t_change = pr.take_change()
            if t_change is not None:
                # The cell is no longer what its samples say (it recovered, or slowed while idle).
                dropped = self.state.estimator.forget_before(t_change, by_arrival=True)
                self.refit_now = True
                self.changed("probes", "slower" if surprised > 0 else "faster", samples_dropped=dropped)

    def changed(self, source: str, direction: str, **fields: float) -> None:
        """A declared change of the cell (its older samples dropped): counted and logged."""
        self.changes[source, direction] += 1
        log.info("cell_change_detected", cell=self.state.cell, source=source, direction=direction, **fields)

    async def envoy_check_loop(self, address: str, period_s: float, fail_threshold: int = 2) -> None:
        """TCP-connect to the leaf Envoy's listener every ``period_s``.

        Probes reach the agent directly, not through the leaf Envoy; without this check a dead leaf
        Envoy would leave the cell looking healthy to every root while all its requests fail.
        """
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        while True:
            ok = True
            try:
                async with asyncio.timeout(min(1.0, 5 * period_s)):
                    _, writer = await asyncio.open_connection(host, int(port))
                writer.close()
            except (TimeoutError, OSError):
                ok = False
            if ok:
                if not self.envoy_ok:
                    log.info("leaf_envoy_reachable", cell=self.state.cell, address=address)
                self.envoy_check_failures = 0
                self.envoy_ok = True
            else:
                self.envoy_check_failures += 1
                if self.envoy_ok and self.envoy_check_failures >= fail_threshold:
                    (log.info if self.stopping() else log.warning)("leaf_envoy_unreachable", cell=self.state.cell, address=address)
                    self.envoy_ok = False
            await asyncio.sleep(period_s)

    async def envoy_health_loop(self, admin: str, period_s: float) -> None:
        """Read which servers the leaf Envoy routes to from its admin ``/clusters`` every ``period_s``
        and apply it (:meth:`LeafState.set_envoy_view`), so probes report the healthy servers the Envoy
        has, not ones the agent believes in on its own. An unreadable admin keeps the last view (a dead
        Envoy is :meth:`envoy_check_loop`'s to report)."""
        failures = 0
        while True:
            try:
                body = await http_get(admin, "/clusters?format=json", min(1.0, max(0.2, period_s)))
                _, out = hosts_out(body, LEAF_SERVERS_CLUSTER)
            except (OSError, TimeoutError, ValueError) as e:
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    (log.info if self.stopping() else log.warning)(
                        "leaf_envoy_admin_unreadable", cell=self.state.cell, admin=admin, error=str(e) or type(e).__name__,
                        failures=failures)
            else:
                if failures:
                    log.info("leaf_envoy_admin_readable", cell=self.state.cell, admin=admin)
                failures = 0
                self.state.set_envoy_view(out)
            await asyncio.sleep(period_s)


def background_config(bg: BackgroundProbeParams) -> BackgroundProbeConfig | None:
    """The background prober's settings from the ``background-probe`` plugin (None: ``min_interval_ms: 0``, off).

    Raises ValueError for settings the prober refuses (the CLI reports it; over xDS it is a NACK)."""
    if bg.min_interval_ms <= 0:
        return None
    return BackgroundProbeConfig(min_interval_s=bg.min_interval_ms / 1000.0, max_interval_s=bg.max_interval_ms / 1000.0,
                                 budget=bg.budget)


def background_body(bg: BackgroundProbeParams) -> bytes:
    """The probe: a chat completion of exactly ``max_tokens`` tokens (``ignore_eos``, so its size — and so
    its latency — does not vary from probe to probe)."""
    body: dict = {"messages": [{"role": "user", "content": "dlb background probe"}],
                  "max_tokens": bg.max_tokens, "ignore_eos": True}
    if bg.model:
        body["model"] = bg.model
    return json.dumps(body, separators=(",", ":")).encode()
