"""OpenTelemetry traces from DLB's services: off unless an OTLP collector is named.

Why spans are recorded after the fact (start and end times passed in) rather than around the code: a
pick takes microseconds on the event loop; the span is built from what the pick decided, and the
SDK's batch processor exports from its own thread, so no request waits on the collector. The parent is
the W3C ``traceparent`` the request carries (the client's, or Envoy's when its tracer is on), so a
DLB span joins the request's trace. Sampling follows the parent's flag, else ``sample_ratio``.

``opentelemetry`` is imported only when tracing is on: a service without it pays nothing. The sampling
decision is taken before any span is built (:meth:`Tracer.sampled`): an unsampled request costs a flag
test, not a span. Measured per root decision at 1 % (in process, loaded 2-core box): +1.3 µs without a
``traceparent``, +2.7 µs with an unsampled one (its second parse), against +11 µs when the SDK decided
— 1–3 % of the root service's ~0.1 ms CPU per request.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dlb.errors import UsageError

AttributeValue = str | int | float | bool


#: ``--trace-sample-ratio`` when not given.
DEFAULT_SAMPLE_RATIO = 0.01


def sample_ratio(args: Any) -> float:
    """``--trace-sample-ratio`` or its default; a UsageError when given without ``--otlp-endpoint``, which
    left tracing off without a word."""
    if args.trace_sample_ratio is None:
        return DEFAULT_SAMPLE_RATIO
    if not args.otlp_endpoint:
        raise UsageError(f"--trace-sample-ratio {args.trace_sample_ratio:g} needs --otlp-endpoint: without a collector "
                         "tracing is off")
    return float(args.trace_sample_ratio)


@dataclass(frozen=True)
class TracingOptions:
    """Where spans go: ``otlp_endpoint`` ``host:port`` of an OTLP/gRPC collector (None: tracing off)."""

    otlp_endpoint: str | None = None
    sample_ratio: float = DEFAULT_SAMPLE_RATIO
    service_name: str = "dlb"

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be in [0, 1], got {self.sample_ratio}")


class Tracer:
    """Records finished spans under a request's ``traceparent`` and exports them over OTLP/gRPC."""

    def __init__(self, options: TracingOptions, exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=options.otlp_endpoint, insecure=True)
        self.ratio = options.sample_ratio
        self._rng = random.Random()
        # Sampling is decided in sampled(); the SDK records whatever it is handed.
        self._provider = TracerProvider(resource=Resource.create({"service.name": options.service_name}), sampler=ALWAYS_ON)
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self._tracer = self._provider.get_tracer("dlb")
        self._propagator = TraceContextTextMapPropagator()

    def sampled(self, traceparent: str | None) -> bool:
        """The parent's sampled flag when the request carries a valid ``traceparent``, else ``sample_ratio``."""
        if traceparent:
            parts = traceparent.strip().split("-")
            if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16 and len(parts[3]) == 2:
                try:
                    return bool(int(parts[3], 16) & 1)
                except ValueError:
                    pass
        return self._rng.random() < self.ratio

    def record(self, name: str, traceparent: str | None, start_ns: int, end_ns: int,
               attributes: Mapping[str, AttributeValue] | Callable[[], Mapping[str, AttributeValue]],
               error: str | None = None) -> None:
        """One finished span, child of ``traceparent`` (a new trace without one); call it for sampled
        requests only. ``attributes`` may be a function, called once the span is known to record."""
        from opentelemetry.trace import Status, StatusCode

        ctx = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        span = self._tracer.start_span(name, context=ctx, start_time=start_ns)
        if not span.is_recording():
            return
        span.set_attributes(dict(attributes() if callable(attributes) else attributes))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (at the service's exit)."""
        self._provider.shutdown()


def otlp_unavailable() -> str | None:
    """Why the OTLP exporter cannot load in this environment (None: it can).

    xds-protos (Envoy's API) ships an older copy of opentelemetry-proto's modules at the same paths; when
    pip installs it after opentelemetry-proto (as one ``pip install -e .`` into a fresh venv does), the
    exporter's imports fail. The install commands (README, ``.ci/run``, the Dockerfile) install
    xds-protos first; this names the problem in one line for a venv built otherwise.
    """
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: F401
    except ImportError as e:
        return (f"the OTLP exporter cannot load ({e}): xds-protos installed an older copy of opentelemetry-proto's "
                "modules over it; `pip install --force-reinstall --no-deps opentelemetry-proto==<its version>` restores them "
                "(install xds-protos first, then dlb, to avoid it)")
    return None


def make_tracer(options: TracingOptions) -> Tracer | None:
    """The service's tracer, or None when tracing is off; UsageError when it is on but cannot export."""
    if not options.otlp_endpoint:
        return None
    reason = otlp_unavailable()
    if reason is not None:
        raise UsageError(f"--otlp-endpoint: {reason}")
    return Tracer(options)
