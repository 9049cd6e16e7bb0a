"""The emulated inference server: OpenAI-compatible HTTP in front of the continuous-batching model.

One asyncio event loop runs both the aiohttp handlers and one *engine coroutine* that plays the GPU:
it asks the pure :class:`~dlb.emulator.engine.Engine` for the next step, sleeps the step's time
(scaled by ``time_scale`` and the ``slowdown`` fault) and hands every produced token to the waiting
handler, which streams it at once as one SSE chunk. Requests that arrive during a step join at the
next step boundary, as on a real continuous-batching server.

Run it in-process with ``async with EmulatorServer(...)`` (inside an event loop) or
``with ThreadedEmulator(...)`` (from synchronous code; it owns a loop on a thread), or as a child
process with :class:`dlb.testbed.emulator.EmulatorProcess`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from aiohttp import web

from dlb.emulator import clock
from dlb.emulator.engine import Engine, EngineRequest, StepPlan, TokenEvent
from dlb.emulator.faults import FaultError, Faults
from dlb.emulator.metrics import CONTENT_TYPE, EmulatorMetrics
from dlb.emulator.openai import (
    CHARS_PER_TOKEN,
    SSE_DONE,
    ApiError,
    ChunkEncoder,
    Kind,
    OutputSampler,
    ParsedRequest,
    full_response,
    load_json,
    parse_request,
    sse,
    token_text,
    usage_chunk,
)
from dlb.emulator.prefix_cache import BLOCK_TOKENS, PrefixCache, text_blocks, token_blocks
from dlb.emulator.profile import Profile, load_profile
from dlb.log import get_logger

SERVER_HEADER = "x-dlb-server"
_MAX_LAG_S = 0.05  # the engine catches up at most this much after an oversleep (timer granularity)
#: A header line or URL the emulator parses: above the Envoys' ``max_request_headers_kb`` (60), so whatever a leaf
#: forwards reaches the handler (aiohttp's default, 8190, answered a 10-KB header with a text/plain 400).
MAX_HEADER_BYTES = 64 * 1024



def _log() -> Any:
    # Fetched lazily: a module-level logger would configure logging at import, before the CLI's flags.
    return get_logger("dlb.emulator")


@dataclass
class EmulatorConfig:
    """Everything that defines one emulated server (the CLI flags map 1:1 onto these fields)."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port; read it back from ``EmulatorServer.port``
    #: The admin API (``/admin/faults``, ``/admin/state``) listens here, never on ``port``: whoever reaches the
    #: API (clients, a leaf Envoy) must not be able to slow or break the server (issue 14 row 9). 0 = a free
    #: port (``EmulatorServer.admin_port``); None = no admin API (faults only from the config).
    admin_port: int | None = 0
    server_id: str = "emulator"
    models: tuple[str, ...] = ("dlb-emulated",)
    profile: Profile | str = "llama-8b-h100"
    max_batch: int = 16
    max_queue: int = 64
    seed: int = 0
    time_scale: float = 1.0  # wall seconds per profile second (0.1 = run 10x faster)
    overflow_status: int = 429  # status when the queue is full: 429 or 503
    output_mode: str = "max_tokens"  # see OutputSampler
    output_mean: float = 128.0
    max_model_len: int = 32768
    prefix_cache: bool = False  # model vLLM's automatic prefix caching (repeated prefixes skip prefill)
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        if isinstance(self.models, str):
            self.models = (self.models,)
        self.models = tuple(self.models)
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError(f"models: need at least one non-empty model name, got {self.models!r}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale: must be > 0, got {self.time_scale}")
        if self.overflow_status not in (429, 503):
            raise ValueError(f"overflow_status: must be 429 or 503, got {self.overflow_status}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {self.max_model_len}")

    def resolved_profile(self) -> Profile:
        return self.profile if isinstance(self.profile, Profile) else load_profile(self.profile)


@dataclass(eq=False)
class _Live:
    """A request a handler is waiting on."""

    req: EngineRequest
    finish_reason: str
    stream: asyncio.Queue[TokenEvent | None] | None  # streaming: every token; else None
    done: asyncio.Future[None]
    blocks: tuple[bytes, ...] = ()  # prefix-cache blocks, cached once the prompt is computed


def _error(e: ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status)


class EmulatorServer:
    """One emulated GPU inference server on a real TCP socket."""

    def __init__(self, config: EmulatorConfig | None = None, **overrides: Any) -> None:
        self.config = replace(config or EmulatorConfig(), **overrides)
        self.profile = self.config.resolved_profile()
        self.engine = Engine(self.profile, max_batch=self.config.max_batch, max_queue=self.config.max_queue)
        self.metrics = EmulatorMetrics(self.config.models)
        self.sampler = OutputSampler(mean=self.config.output_mean, mode=self.config.output_mode,  # type: ignore[arg-type]
                                     seed=self.config.seed)  # fmt: skip
        self.faults: Faults = self.config.faults
        self._fault_rng = random.Random(self.config.seed ^ 0x5EED)
        self.prefix_cache = (PrefixCache(max(1, self.profile.kv_cache_tokens // BLOCK_TOKENS))
                             if self.config.prefix_cache else None)  # fmt: skip
        self._ids = itertools.count(1)
        self._live: dict[int, _Live] = {}
        self._wake = asyncio.Event()
        #: Set on every fault change, so the step under way takes the new slowdown (``clock.StepEnd``).
        self.step_end = clock.StepEnd()
        self._runner: web.AppRunner | None = None
        self._admin_runner: web.AppRunner | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self.port: int = 0
        self.admin_port: int | None = None  # bound admin port once started (None: no admin API)

    # -- lifecycle -------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        if self.admin_port is None:
            raise RuntimeError(f"emulator {self.config.server_id} has no admin API (admin_port=None)")
        return f"http://{self.config.host}:{self.admin_port}"

    def build_app(self) -> web.Application:
        """The OpenAI-compatible API, ``/health`` and ``/metrics`` (as vLLM serves them); no admin paths."""
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._json_errors])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.on_response_prepare.append(self._tag_response)
        return app

    def build_admin_app(self) -> web.Application:
        """Fault knobs and the scheduler snapshot, on ``admin_port`` only (a fault patch is tiny: 1 MiB bounds it)."""
        app = web.Application(client_max_size=1 << 20, middlewares=[self._json_errors])
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._post_faults)
        app.router.add_delete("/admin/faults", self._reset_faults)
        app.router.add_post("/admin/faults/reset", self._reset_faults)
        app.router.add_get("/admin/state", self._state)
        app.on_response_prepare.append(self._tag_response)
        return app

    async def _listen(self, app: web.Application, port: int) -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0,
                               max_line_size=MAX_HEADER_BYTES, max_field_size=MAX_HEADER_BYTES)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.host, port, reuse_address=True).start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner, runner.addresses[0][1]

    async def start(self, run_engine: bool = True) -> None:
        """Listen and start the engine coroutine; ``run_engine=False`` leaves stepping to a caller that
        drives several engines in lock step (:class:`dlb.emulator.dp.DpEmulator`)."""
        self._wake = asyncio.Event()  # bind to the running loop
        self.step_end = clock.StepEnd()
        self._runner, self.port = await self._listen(self.build_app(), self.config.port)
        if self.config.admin_port is not None:
            try:
                self._admin_runner, self.admin_port = await self._listen(self.build_admin_app(), self.config.admin_port)
            except BaseException:
                await self._runner.cleanup()
                self._runner = None
                raise
        if run_engine:
            self._engine_task = asyncio.create_task(self._engine_loop(), name=f"emulator-engine-{self.config.server_id}")
            self._engine_task.add_done_callback(self._engine_died)
        _log().info(
            "emulator_started",
            server_id=self.config.server_id,
            address=self.address,
            admin_port=self.admin_port,
            models=list(self.config.models),
            profile=self.profile.name,
            max_batch=self.config.max_batch,
            max_queue=self.config.max_queue,
            time_scale=self.config.time_scale,
            seed=self.config.seed,
            faults=self.faults.to_dict(),
        )

    async def stop(self) -> None:
        """Stop the way a dying server looks to its proxy: first no new request gets in (listener and idle
        keep-alive connections closed: a proxy's next try is a connect failure, which it retries
        elsewhere), then the engine stops and requests in flight end. Stopping the engine first left a
        window in which new requests were answered ``503 engine_not_running`` (2 in a solo fault run)."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
            if self._runner.server is not None:
                self._runner.server.pre_shutdown()
        if self._engine_task is not None:
            self._engine_task.cancel()
            try:
                await self._engine_task
            except asyncio.CancelledError:
                pass
            except Exception:  # already logged by _engine_died
                pass
            self._engine_task = None
        for live in list(self._live.values()):  # let waiting handlers answer before the socket closes
            if live.stream is not None:
                live.stream.put_nowait(None)
            elif not live.done.done():
                live.done.set_exception(ApiError(503, "server is shutting down", type_="server_error", code="server_shutting_down"))
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            _log().info("emulator_stopped", server_id=self.config.server_id)

    async def __aenter__(self) -> EmulatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def set_faults(self, patch: Any = None, /, **changes: Any) -> Faults:
        """Change fault knobs (a dict and/or keywords; same rules as ``POST /admin/faults``).

        Call on the server's loop (``ThreadedEmulator.set_faults`` does that for you)."""
        self.faults = self.faults.updated({} if patch is None else patch).updated(changes)
        self.step_end.move()
        _log().info("emulator_faults", server_id=self.config.server_id, **self.faults.to_dict())
        return self.faults

    # -- the GPU ---------------------------------------------------------------------------------------

    def _engine_died(self, task: asyncio.Task[None]) -> None:
        """A bug in the engine loop must not leave requests hanging silently: log it, fail them."""
        if task.cancelled() or task.exception() is None:
            return
        _log().error("emulator_engine_failed", server_id=self.config.server_id, error=repr(task.exception()))
        for live in list(self._live.values()):
            if live.stream is not None:
                live.stream.put_nowait(None)
            elif not live.done.done():
                live.done.set_exception(ApiError(500, "emulator engine failed", type_="server_error", code="engine_failed"))

    async def _engine_loop(self) -> None:
        deadline = clock.now()
        while True:
            plan = self.engine.plan(clock.now())
            self.metrics.sync_engine(self.engine)
            if plan is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = clock.now()
                continue
            # Absolute deadlines: timer granularity (~1 ms) would otherwise add up step after step.
            base = plan.duration * self.config.time_scale
            start = max(deadline, clock.now() - _MAX_LAG_S)
            deadline = await self.step_end.sleep_step(start, base, lambda: self.faults.slowdown)
            done_at = clock.now()
            events = self.engine.complete(plan, done_at)
            self._account(plan, events, done_at)

    def _account(self, plan: StepPlan, events: list[TokenEvent], now: float) -> None:
        """Metrics and hand-off of one finished step (the gauges follow at the next ``plan``)."""
        series = self.metrics.series
        for r, n in plan.prefill:
            if not r.aborted:
                series[r.model].prompt_tokens.inc(n)
        for ev in events:
            r = ev.request
            s = series[r.model]
            s.generation_tokens.inc()
            live = self._live.get(r.rid)
            if ev.index == 0 and r.first_token_at is not None:
                if live is not None and live.blocks and self.prefix_cache is not None:
                    self.prefix_cache.insert(live.blocks)
                s.ttft.observe(r.first_token_at - r.arrival)
                if r.admitted_at is not None:
                    s.queue_time.observe(r.admitted_at - r.arrival)
            if ev.finished:
                s.e2e.observe(now - r.arrival)
                if r.generated > 1 and r.first_token_at is not None:
                    s.tpot.observe((now - r.first_token_at) / (r.generated - 1))
                self.metrics.success.labels(r.model, live.finish_reason if live else "length").inc()
            if live is None:
                continue
            if live.stream is not None:
                live.stream.put_nowait(ev)
            if ev.finished and not live.done.done():
                live.done.set_result(None)

    # -- HTTP ------------------------------------------------------------------------------------------

    async def _tag_response(self, _request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SERVER_HEADER] = self.config.server_id

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Routing errors (unknown path, wrong method) in OpenAI's error body, not aiohttp's text."""
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return _error(ApiError(e.status, f"{e.reason}: {request.method} {request.path}", type_="invalid_request_error"))

    def _down(self) -> web.Response | None:
        if self.faults.down:
            return _error(ApiError(503, "server is down (injected fault)", type_="server_error", code="server_down"))
        return None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, "chat")

    async def _infer(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        if (down := self._down()) is not None:
            self.metrics.rejected.labels(self.config.models[0], "down").inc()
            return down
        raw = await request.read()
        try:
            parsed = parse_request(kind, raw, self.config.models, self.config.max_model_len)
        except ApiError as e:
            return _error(e)
        faults = self.faults
        if faults.extra_latency_ms > 0:
            await asyncio.sleep(faults.extra_latency_ms / 1000.0)
        if faults.inject_error(self._fault_rng):
            self.metrics.rejected.labels(parsed.model, "injected_error").inc()
            return _error(ApiError(faults.error_status, f"injected error (error_rate={faults.error_rate})",
                                   type_="server_error", code="injected_fault"))  # fmt: skip
        try:
            live = self._enqueue(parsed)
        except ApiError as e:
            return _error(e)
        req = live.req
        rid = req.rid
        cached_out = req.cached_tokens if self.prefix_cache is not None else None
        finish_reason = live.finish_reason
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        resp_id = f"{prefix}-{self.config.server_id}-{rid}"
        created = int(time.time())
        try:
            if parsed.stream:
                return await self._stream(request, live, kind, resp_id, created, parsed.model, parsed.include_usage,
                                          cached_out)  # fmt: skip
            try:
                await live.done
            except ApiError as e:
                return _error(e)
            text = "".join(token_text(rid, i) for i in range(req.generated))
            return web.json_response(full_response(kind, resp_id, created, parsed.model, text, finish_reason,
                                                   req.prompt_tokens, req.generated, cached_out))  # fmt: skip
        finally:
            self._live.pop(rid, None)
            if not req.finished and not req.aborted:
                self.engine.abort(req)  # client went away or server stopping: free the slot, like vLLM
                self.metrics.sync_engine(self.engine)

    def _enqueue(self, parsed: ParsedRequest) -> _Live:
        """Size the request (output length, cached prefix) and queue it; ApiError if it cannot run."""
        if self._engine_task is None or self._engine_task.done():
            raise ApiError(503, "emulator engine is not running", type_="server_error", code="engine_not_running")
        n_out, finish_reason = self.sampler.output_tokens(parsed, self.config.max_model_len)
        blocks: tuple[bytes, ...] = ()
        cached = 0
        if self.prefix_cache is not None:
            p = parsed.prefix
            blocks = text_blocks(p, CHARS_PER_TOKEN) if isinstance(p, str) else token_blocks(p)
            cached = self.prefix_cache.match(blocks)
        req = EngineRequest(rid=next(self._ids), prompt_tokens=parsed.prompt_tokens, output_tokens=n_out,
                            model=parsed.model, cached_tokens=cached)  # fmt: skip
        if not self.engine.submit(req, clock.now()):
            self.metrics.rejected.labels(parsed.model, "queue_full").inc()
            msg = (f"server overloaded: {len(self.engine.waiting)} requests waiting, {len(self.engine.running)} "
                   f"running (max_batch={self.config.max_batch}, max_queue={self.config.max_queue})")  # fmt: skip
            if self.config.overflow_status == 429:
                raise ApiError(429, msg, type_="requests", code="rate_limit_exceeded")
            raise ApiError(503, msg, type_="server_error", code="overloaded")
        if self.prefix_cache is not None:
            series = self.metrics.series[parsed.model]
            series.prefix_queries.inc(req.prompt_tokens)
            series.prefix_hits.inc(req.cached_tokens)
        live = _Live(req, finish_reason, asyncio.Queue() if parsed.stream else None, asyncio.get_running_loop().create_future(), blocks)
        self._live[req.rid] = live
        self.metrics.sync_engine(self.engine)
        self._wake.set()
        return live

    async def _stream(self, request: web.Request, live: _Live, kind: Kind, resp_id: str, created: int, model: str,
                      include_usage: bool, cached_tokens: int | None) -> web.StreamResponse:  # fmt: skip
        assert live.stream is not None
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        req = live.req
        enc = ChunkEncoder(kind, resp_id, created, model, include_usage)
        finished = False
        try:
            while not finished:
                # One chunk per token; tokens that piled up while we were writing go out in one write.
                events = [await live.stream.get()]
                while not live.stream.empty():
                    events.append(live.stream.get_nowait())
                out: list[bytes] = []
                for ev in events:
                    if ev is None:  # server stopping: end the stream without [DONE], as a dying server would
                        if out:
                            await resp.write(b"".join(out))
                        return resp
                    reason = live.finish_reason if ev.finished else None
                    out.append(enc.token(token_text(req.rid, ev.index), reason, role=(kind == "chat" and ev.index == 0)))
                    finished = ev.finished
                await resp.write(b"".join(out))
            if include_usage:
                await resp.write(sse(usage_chunk(kind, resp_id, created, model, req.prompt_tokens, req.generated,
                                                 cached_tokens)))  # fmt: skip
            await resp.write(SSE_DONE)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # client went away; the caller aborts the request
        return resp

    async def _models(self, _request: web.Request) -> web.Response:
        if (down := self._down()) is not None:
            return down
        created = int(time.time())
        data = [{"id": m, "object": "model", "created": created, "owned_by": "dlb-emulator", "root": m,
                 "max_model_len": self.config.max_model_len} for m in self.config.models]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def _health(self, _request: web.Request) -> web.Response:
        if self.faults.health_delay_ms > 0:
            await asyncio.sleep(self.faults.health_delay_ms / 1000.0)
        return self._down() or web.Response(status=200)

    async def _metrics(self, _request: web.Request) -> web.Response:
        if (down := self._down()) is not None:
            return down
        self.metrics.sync_engine(self.engine)
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _get_faults(self, _request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_dict())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            patch = load_json(await request.read() or b"{}")
        except ApiError as e:
            return _error(e)
        try:
            return web.json_response(self.set_faults(patch).to_dict())
        except FaultError as e:
            return _error(ApiError(400, str(e), param=str(e).split(":", 1)[0]))

    async def _reset_faults(self, _request: web.Request) -> web.Response:
        self.faults = Faults()
        self.step_end.move()
        _log().info("emulator_faults", server_id=self.config.server_id, reset=True, **self.faults.to_dict())
        return web.json_response(self.faults.to_dict())

    async def _state(self, _request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response({
            "server_id": self.config.server_id,
            "models": list(self.config.models),
            "running": len(e.running),
            "waiting": len(e.waiting),
            "kv_usage": e.kv_usage,
            "prefix_cache_blocks": None if self.prefix_cache is None else len(self.prefix_cache),
            "steps": e.steps,
            "faults": self.faults.to_dict(),
            "profile": self.profile.to_dict(),
            "config": {k: v for k, v in asdict(self.config).items() if k not in ("profile", "faults")},
        })  # fmt: skip


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop if installed (it is a dependency), else asyncio's default loop."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


class ThreadedEmulator:
    """An :class:`EmulatorServer` on its own event loop in a daemon thread, for synchronous code.

    ``with ThreadedEmulator(profile="fast-test") as emu: requests to emu.url``. ``stop()`` is idempotent
    and always joins the thread.
    """

    def __init__(self, config: EmulatorConfig | None = None, **overrides: Any) -> None:
        self._config = replace(config or EmulatorConfig(), **overrides)
        self.server: EmulatorServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.server is not None, "not started"
        return self.server.url

    @property
    def port(self) -> int:
        assert self.server is not None, "not started"
        return self.server.port

    @property
    def address(self) -> str:
        assert self.server is not None, "not started"
        return self.server.address

    @property
    def admin_url(self) -> str:
        assert self.server is not None, "not started"
        return self.server.admin_url

    def start(self, timeout: float = 10.0) -> ThreadedEmulator:
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = self._loop = new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self.server = EmulatorServer(self._config)
                loop.run_until_complete(self.server.start())
            except BaseException as e:  # report start-up failures to the caller's thread
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"emulator-{self._config.server_id}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"emulator {self._config.server_id} did not start within {timeout}s")
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the server's loop (thread-safe) and return its result."""
        assert self._loop is not None

        async def run() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def set_faults(self, **patch: Any) -> Faults:
        assert self.server is not None
        return self.call(self.server.set_faults, **patch)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if self.server is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.server.stop(), loop).result(15)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(15)

    def __enter__(self) -> ThreadedEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
