"""Every benchmark's command: one table of name → (help, options, runner); the work is in each bench module.

Why one module: the benchmarks' options, ``--json`` and exit rule were written eleven times; here each
bench says only what is its own, and :mod:`dlb.bench.harness` does the rest. A bench module is
imported only when its command runs (``dlb --help`` stays light).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dlb.bench.harness import add_json_option, invoked_as
from dlb.load.argtypes import float_in, non_negative_int, output_dir, positive_float, positive_int, rng_seed

Setup = Callable[[argparse.ArgumentParser], None]


def _int_list(low: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: a comma-separated list of integers, each >= ``low`` (a 0 or negative group size was a
    traceback from deep inside a study)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            out = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not out or min(out) < low:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {low}, got {text!r}")
        return out

    return parse


_ints = _int_list(0)
_counts = _int_list(1)


def _generations(text: str) -> float:
    """``--generations``: above 1, so a backlog waits once every slot is filled (the figures are taken then)."""
    v = positive_float(text)
    if v <= 1:
        raise argparse.ArgumentTypeError(f"must be > 1 (G·B requests fill every slot at once; the figures are "
                                         f"measured while a backlog waits), got {text}")
    return v


def _int_upto(high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [0, high] (the bounds the leaf config puts on the same field)."""

    def parse(text: str) -> int:
        v = non_negative_int(text)
        if v > high:
            raise argparse.ArgumentTypeError(f"must be an integer in [0, {high}], got {text}")
        return v

    return parse


def _choices(known: tuple[str, ...], what: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated subset of ``known`` (an unknown name failed after the stack was up
    and the first policy had run, naming a temporary config file)."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in names if x not in known]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad) or repr(text)} (choose from {', '.join(known)})")
        return names

    return parse


_mean_decode = float_in(1.0, 1e6, " (the mean of a geometric length in tokens)")
_horizon = _int_upto(10_000)  # the config's dp group horizon bounds (dlb.config.schema)
#: Arrivals as a multiple of decode capacity: 0 or less had no arrivals (a garbage mean), and below a tenth
#: the group idles between requests while the run grows as 1/load steps.
_load_factor = float_in(0.1, 100.0)


def _pick(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decisions", type=positive_int, default=20_000, help="picks timed per cell count and policy (default 20000)")
    add_json_option(p, "the records")


def _envoy_push(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=50, help="weight changes timed per protocol (default 50)")
    p.add_argument("--cells", type=int, default=4, help="cells in the routed split (default 4)")
    add_json_option(p, "the records")


def _xds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", default="10,100,500", help="comma-separated stream counts (default 10,100,500)")
    p.add_argument("--updates", type=int, default=5, help="weight updates per stream count (default 5)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for all ACKs of one update")
    add_json_option(p, "the records")
    p.add_argument("--uvloop", action="store_true", help="run the server process on uvloop")
    p.add_argument("--server-gc", choices=("control-plane", "python"), default="control-plane",
                   help="the server process's garbage collector: as dlb control-plane sets it (start-up heap frozen, "
                        "young threshold raised; default) or Python's defaults")
    p.add_argument("--delta", action="store_true", help="clients use incremental (delta) ADS instead of SotW")
    p.add_argument("--resources", type=int, default=1,
                   help="1 (default): one RDS route whose weights change; K > 1: wildcard CDS of K clusters, one changes per update")
    p.add_argument("--client-procs", type=int, default=2,
                   help="processes the clients run in, streams split evenly (default 2; 0 = in the bench's own process)")
    p.add_argument("--profile", default=None, metavar="FILE", help="write the server's cProfile statistics to FILE")
    p.add_argument("--transport", choices=("h2", "grpc"), default="h2",
                   help="the server's transport: DLB's own HTTP/2 server (default, as dlb control-plane) or grpc.aio")
    p.add_argument("--connections", choices=("per-client", "shared"), default="per-client",
                   help="a TCP connection per client, as every Envoy has (default), or one per client process (gRPC's default)")
    p.add_argument("--client-impl", choices=("grpc", "wire"), default="grpc",
                   help="the clients: DLB's own XdsClient on grpc.aio (default), or a lean HTTP/2 client that does per update "
                        "what Envoy does (decode, ACK) at a fraction of grpc.aio's CPU (SotW, --client-procs >= 1)")


def _overhead(p: argparse.ArgumentParser) -> None:
    from dlb.bench import overhead as o

    add_json_option(p, "the records (list of {config, mode, rate, p50_ms, p99_ms, rps, cpu_s_per_1k, ...})")
    p.add_argument("--duration", type=positive_float, default=6.0, help="seconds per configuration and mode (default 6)")
    p.add_argument("--connections", type=int, default=16, help="closed-loop concurrency (default 16)")
    p.add_argument("--slices", type=int, default=6, help="interleave configurations in this many slices per point (default 6)")
    p.add_argument("--configs", nargs="+", choices=o.CONFIGS + o.EXTRA_CONFIGS, default=list(o.CONFIGS),
                   help=f"systems to compare ({o.RESP_CONFIG}: leaf ext_proc also sees response headers; "
                        f"{o.LR_CONFIG}: no leaf ext_proc, Envoy LEAST_REQUEST + access log; {o.W2_CONFIG}: root service with "
                        f"2 workers; {o.BARE_CONFIG}/{o.BARE_H2_CONFIG}: constant-reply servicer on grpc.aio / on DLB's h2 "
                        f"transport (floors); {o.GRPC_CONFIG}: the root service on grpc.aio; {o.MTLS_CONFIG}: the root hop "
                        f"under mutual TLS; {o.NATIVE_CONFIG}: flow routing in Envoy's weighted_clusters "
                        f"from a live control plane, no ext_proc on the request; {o.NATIVE_DISCRETE_CONFIG}: native-discrete, "
                        f"Envoy's least-request over cells weighted by the control plane; {o.TRACED_CONFIG}: the root hop with "
                        f"Envoy's and the root's spans at {o.TRACE_RATIO:g} sampling to an in-process OTLP collector, judged "
                        "against root)")
    p.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto",
                   help="load generator: wrk (C; apt-get install wrk), python (asyncio, in this process), auto = wrk if installed")
    p.add_argument("--envoy-concurrency", type=int, default=1, help="worker threads of each Envoy under test (default 1)")
    p.add_argument("--trace-ratio", type=float, default=o.TRACE_RATIO,
                   help=f"sampling ratio of {o.TRACED_CONFIG} (default {o.TRACE_RATIO:g}: the ratio its CPU target is for)")
    p.add_argument("--smoke", action="store_true", help="tiny CI version: 0.5 s points, 4 connections")
    p.add_argument("--budgets", default=None, metavar="FILE",
                   help="CPU-per-request budgets per machine kind, as ratios to the floor measured in the same run (default: the "
                        "committed file, not enforced with --smoke); a budgeted configuration adds the floor; exit 1 naming each over budget")
    p.add_argument("--machine-kind", default=None, help="budget entry to use (default: this machine's, e.g. x86_64-2cpu)")


def _faults(p: argparse.ArgumentParser) -> None:
    from dlb.bench import faults as f

    add_json_option(p, "the rows")
    p.add_argument("--faults", default=None, help=f"comma-separated subset of {','.join(f.FAULTS)}")
    p.add_argument("--modes", default=None, help=f"comma-separated subset of {','.join(f.MODES)}")
    p.add_argument("--rate", type=float, default=40.0, help="Poisson arrivals per second")
    p.add_argument("--cells", default=",".join(map(str, f.CELLS)), help="servers per cell a,b,c,… (a is the root's cell and fails)")
    p.add_argument("--time-scale", type=float, default=4.0, help=f"the emulated servers run this much slower than {f.PROFILE}")
    p.add_argument("--fault-at-s", type=float, default=8.0, help="seconds of load before the fault (default 8)")
    p.add_argument("--outage-s", type=float, default=10.0, help="how long the fault lasts, in seconds (default 10)")
    p.add_argument("--after-s", type=float, default=15.0, help="traffic after the restore (recovery is measured here)")
    p.add_argument("--duration", type=float, default=None, help="seconds of traffic per run (sets --after-s to what is left)")
    p.add_argument("--policy", default="Disc-RIF", help="comma-separated DLB policies or operator baselines, rows for each (default Disc-RIF)")
    p.add_argument("--runs", type=int, default=3, help="runs per row, reported as min/median/max (default 3)")
    p.add_argument("--native", action="store_true", help="flow policies run natively: no root service, the root Envoy "
                   "configured by the control plane (root_service rows skipped)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per chat and short stream (long streams: ~3.5 s)")
    p.add_argument("--seed", type=rng_seed, default=1, help="workload seed (default 1)")


def _load(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=300.0, help="streaming requests per second (default 300)")
    p.add_argument("--low-rate", type=float, default=20.0, help="reference rate (default 20)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per rate (default 20)")
    p.add_argument("--chunks", type=int, default=16, help="SSE events per response (default 16)")
    p.add_argument("--first-ms", type=float, default=20.0, help="upstream delay before the first event")
    p.add_argument("--gap-ms", type=float, default=5.0, help="upstream delay between events")
    add_json_option(p, "the results")
    p.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)


def _hostile(p: argparse.ArgumentParser) -> None:
    from dlb.bench import hostile as h

    add_json_option(p, "the records")
    p.add_argument("--attacks", default=None, help=f"comma-separated subset of: {', '.join(h.ATTACKS + h.TLS_ATTACKS)} (default: all; "
                   f"{', '.join(h.TLS_ATTACKS)} only with --tls)")
    p.add_argument("--scale", choices=("ci", "full"), default="ci",
                   help="attack sizes: ci (a smoke run in seconds) or full (the sizes the targets are stated for)")
    p.add_argument("--rate", type=float, default=10.0, help="real requests per second through the root Envoy (default 10)")
    p.add_argument("--settle-s", type=float, default=10.0, help="seconds after each attacker leaves before RSS 'after' (default 10)")
    p.add_argument("--baseline-s", type=float, default=10.0,
                   help=f"seconds of real traffic before any attack (default 10, after {h.WARMUP_S:g} s of warm-up)")
    p.add_argument("--mem-cap-mb", type=int, default=1500, help="address-space cap of the validator; control plane killed past it")
    p.add_argument("--validate-timeout-s", type=float, default=20.0, help="the config validator / a reload is given this long")
    p.add_argument("--tls", action="store_true",
                   help="run the stack with mutual TLS (a throw-away CA; needs 'cryptography'): the attackers have no certificate")


def _emulator_fidelity(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="llama-8b-h100", help="emulator GPU profile (default llama-8b-h100)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32, 64], help="requests in flight per measurement (default 1 4 16 32 64)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt length of each request (default 256)")
    p.add_argument("--output-tokens", type=int, default=64, help="output length of each request (default 64)")
    p.add_argument("--waves", type=int, default=3, help="waves of requests per concurrency (default 3)")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulator time scale: <1 runs faster than the profile (default 1.0)")
    add_json_option(p, "the rows")


def _sim_twin(p: argparse.ArgumentParser) -> None:
    from dlb.sim.policies import ALL_POLICIES
    from dlb.testbed.scenarios import SCENARIOS

    p.add_argument("--real", default=None, help="a real comparison to twin run by run: dlb demo --compare's records.jsonl "
                                                "(or an older --json file); without it, simulate --scenarios x --policies")
    p.add_argument("--scenarios", type=lambda v: v.split(","), default=list(SCENARIOS),
                   help=f"without --real: scenarios to simulate (default all: {','.join(SCENARIOS)})")
    p.add_argument("--policies", type=lambda v: v.split(","), default=["Rand", "lr-global", "locality-failover", "hub-score",
                                                                     "Disc-Lat", "Flow-Grad"],
                   help=f"without --real: policies (default Rand, the operator baselines, Disc-Lat, Flow-Grad; any of {', '.join(ALL_POLICIES)})")
    p.add_argument("--duration", type=float_in(5.0, 86_400.0, " s (the scenarios' phases are fractions of it)"), default=45.0,
                   help="without --real: simulated seconds per run (default 45)")
    p.add_argument("--trials", type=positive_int, default=3, help="without --real: trials per (scenario, policy), the real runs' seeds (default 3)")
    add_json_option(p, "the records")


def _bfio_study(p: argparse.ArgumentParser) -> None:
    from dlb.bench import bfio_study as b

    p.add_argument("--G", dest="gs", type=_counts, default=b.STUDY_G, help="ranks per group (default 8,16,32)")
    p.add_argument("--B", dest="bs", type=_counts, default=b.STUDY_B, help="slots per rank (default 16,64,256)")
    p.add_argument("--H", dest="hs", type=_ints, default=b.STUDY_H, help="BF-IO horizons (default 0,1,10,50,200)")
    p.add_argument("--seeds", type=_ints, default=(1, 2, 3), help="workload seeds; verdicts use per-cell means (default 1,2,3)")
    p.add_argument("--generations", type=_generations, default=3.0, help="requests = G·B·this, > 1 (default 3)")
    p.add_argument("--mean-decode", type=_mean_decode, default=256.0, help="mean of the geometric decode length, >= 1")
    p.add_argument("--prompt-median", type=positive_float, default=600.0, help="median prompt tokens (lognormal)")
    p.add_argument("--prompt-sigma", type=float_in(0.0, 10.0), default=1.0, help="sigma of the lognormal prompt length, in [0, 10]")
    p.add_argument("--profile", default="llama-8b-h100", choices=sorted(b.BUILTIN_PROFILES), help="emulator GPU profile (default llama-8b-h100)")
    add_json_option(p, "the records")
    p.add_argument("--plots", type=output_dir, default=None, help="write the plots into this directory (made if missing)")
    p.add_argument("--milp", action="store_true",
                   help=f"also run BF-IO's batch MILP (H={10}) where G·B <= {b.MILP_MAX_SLOTS}: greedy vs the joint optimum")


def _bfio_bench(p: argparse.ArgumentParser) -> None:
    from dlb.bench import bfio_study as b

    p.add_argument("--G", dest="g", type=positive_int, default=32, help="ranks per group (default 32)")
    p.add_argument("--H", dest="hs", type=_ints, default=b.STUDY_H, help="BF-IO horizons to time (default 0,1,10,50,200)")
    p.add_argument("--picks", type=positive_int, default=5000, help="picks to time (default 5000)")
    add_json_option(p, "the records")


def _bfio_dataplane(p: argparse.ArgumentParser) -> None:
    from dlb.core.bfio import POLICIES as DP_POLICIES
    from dlb.core.hold_queue import MAX_HOLD_S

    p.add_argument("--policies", type=_choices(DP_POLICIES, "policy"), default=("jsq", "bf-io"),
                   help=f"rank-pick policies to compare, comma-separated: {', '.join(DP_POLICIES)} (default jsq,bf-io)")
    p.add_argument("--G", dest="dp_size", type=positive_int, default=4, help="DP ranks (default 4)")
    p.add_argument("--B", dest="max_batch", type=positive_int, default=8, help="running sequences per rank (default 8)")
    p.add_argument("--requests", type=positive_int, default=300, help="requests per policy (default 300)")
    p.add_argument("--rate", type=positive_float, default=17.5,
                   help="Poisson arrivals per wall second (default 17.5: above the default group's capacity at --time-scale 4)")
    p.add_argument("--horizon", type=_horizon, default=10, help="BF-IO horizon in decode steps, 0-10000 (default 10)")
    p.add_argument("--mean-decode", type=_mean_decode, default=32.0, help="mean decode length in tokens, >= 1")
    p.add_argument("--prompt-median", type=positive_float, default=1500.0, help="median prompt tokens")
    p.add_argument("--time-scale", type=positive_float, default=4.0,
                   help="wall seconds per profile second (default 4: long steps, so a busy machine's jitter matters less)")
    p.add_argument("--seeds", type=_ints, default=(1,), help="comma-separated workload seeds; each policy runs every seed (default 1)")
    p.add_argument("--hold", type=_int_upto(100_000), default=0,
                   help="leaf hold queue length, 0-100000 (default 0: off, requests go straight to a rank)")
    p.add_argument("--hold-deadline-ms", type=float_in(1.0, MAX_HOLD_S * 1000), default=60_000.0,
                   help=f"longest hold, 1-{MAX_HOLD_S * 1000:g} (default %(default)s)")
    p.add_argument("--stream", action="store_true", help="clients ask for SSE streams (with usage), which the leaf counts")
    p.add_argument("--no-stream-tokens", dest="stream_tokens", action="store_false",
                   help="leave out the leaf's stream token count: BF-IO estimates decoded tokens from elapsed time")
    add_json_option(p, "the records")


def _bfio_placement(p: argparse.ArgumentParser) -> None:
    from dlb.emulator.profile import BUILTIN_PROFILES

    p.add_argument("--G", dest="g", type=positive_int, default=8, help="ranks per group (default 8)")
    p.add_argument("--B", dest="bs", type=_counts, default=(16, 64), help="slots per rank, comma-separated (default 16,64)")
    p.add_argument("--load", type=_load_factor, default=1.5,
                   help="arrivals as a multiple of the group's decode capacity, in [0.1, 100] (default 1.5)")
    p.add_argument("--generations", type=_generations, default=4.0, help="requests = G·B·this, > 1")
    p.add_argument("--mean-decode", type=_mean_decode, default=256.0, help="mean decode length in tokens, >= 1")
    p.add_argument("--horizon", type=_horizon, default=10, help="BF-IO horizon in decode steps, 0-10000 (default 10)")
    p.add_argument("--seeds", type=_ints, default=(1, 2, 3), help="workload seeds, comma-separated (default 1,2,3)")
    p.add_argument("--profile", default="llama-8b-h100", choices=sorted(BUILTIN_PROFILES), help="emulator GPU profile (default llama-8b-h100)")
    add_json_option(p, "the records")


def _bfio_heldrun(p: argparse.ArgumentParser) -> None:
    p.add_argument("--G", dest="gs", type=_counts, default=(8, 16), help="ranks per group, comma-separated (default 8,16)")
    p.add_argument("--B", dest="bs", type=_counts, default=(32, 16), help="slots per rank, one per --G (default 32,16)")
    p.add_argument("--requests", type=positive_int, default=400, help="requests per run (default 400)")
    from dlb.core.bfio import POLICIES as DP_POLICIES

    p.add_argument("--rate", type=positive_float, default=70.0, help="Poisson arrivals per wall second (default 70)")
    p.add_argument("--time-scale", type=positive_float, default=8.0, help="wall seconds per profile second (default 8)")
    p.add_argument("--window", dest="windows", type=_ints, default=(16,), help="held requests BF-IO chooses among (default 16)")
    p.add_argument("--policies", type=_choices(DP_POLICIES, "policy"), default=("jsq", "bf-io", "round-robin", "least-kv"),
                   help=f"comma-separated: {', '.join(DP_POLICIES)} (default all four)")
    p.add_argument("--horizon", type=_horizon, default=10, help="BF-IO horizon in decode steps, 0-10000 (default 10)")
    p.add_argument("--mean-decode", type=_mean_decode, default=32.0, help="mean decode length in tokens, >= 1")
    p.add_argument("--seeds", type=_ints, default=(1, 2, 3, 4, 5, 6), help="workload seeds (default 1-6)")
    p.add_argument("--no-prefill", action="store_true", help="prefill done elsewhere (the study's assumption)")
    add_json_option(p, "the records")


@dataclass(frozen=True)
class Bench:
    """One benchmark command: its help line, its own options and the ``module:function`` that runs it."""

    help: str
    setup: Setup
    runner: str
    description: str | None = None


#: (group, name) → the bench. The help lines are the ones ``dlb --help`` lists (dlb/cli.py's _COMMANDS).
BENCHES: dict[tuple[str, str], Bench] = {
    ("bench", "envoy-push"): Bench("time from a flow-weight change to a real Envoy applying it", _envoy_push,
                                   "dlb.bench.envoy_push:run"),
    ("bench", "pick"): Bench("per-request decision cost of the root router vs a numpy baseline", _pick, "dlb.bench.pick:run"),
    ("bench", "overhead"): Bench("added latency/throughput/CPU of the root (and leaf) ext_proc hop through real Envoys",
                                 _overhead, "dlb.bench.overhead:run"),
    ("bench", "xds"): Bench("xDS server scale: push-to-ACK latency and memory per stream", _xds, "dlb.bench.xds_scale:run"),
    ("bench", "faults"): Bench("inject each fault under load through real Envoys; what clients lose, how fast DLB recovers",
                               _faults, "dlb.bench.faults:run"),
    ("bench", "load"): Bench("does `dlb load` keep up with a target rate without skewing what it measures", _load,
                             "dlb.bench.load_bench:run", "dlb.bench.load_bench"),
    ("bench", "hostile"): Bench("resource-exhaustion attacks (HPACK, stream and connection floods, stalled TLS handshakes, "
                                "access-log flood, ADS bloat, YAML bomb) against live services while real traffic flows",
                                _hostile, "dlb.bench.hostile:run", "dlb.bench.hostile"),
    ("bench", "emulator-fidelity"): Bench("the emulated server's measured latency vs its own model, and its CPU per token",
                                          _emulator_fidelity, "dlb.bench.emulator_fidelity:run", "dlb.bench.emulator_fidelity"),
    ("bench", "sim-twin"): Bench("the simulator on the demo's fleet vs a real `dlb demo --compare` run", _sim_twin,
                                 "dlb.bench.sim_twin:run", "dlb.bench.sim_twin"),
    ("bfio", "study"): Bench("BF-IO vs round robin / JSQ / least-KV on a simulated DP decode group", _bfio_study,
                             "dlb.bench.bfio_study:run_study_cmd"),
    ("bfio", "bench"): Bench("request-path decision cost of the BF-IO pick (target <= 20 µs, G=32)", _bfio_bench,
                             "dlb.bench.bfio_study:run_bench_cmd"),
    ("bfio", "dataplane"): Bench("BF-IO vs JSQ rank picks through a real leaf Envoy on a DP emulator", _bfio_dataplane,
                                 "dlb.bench.bfio_dataplane:run"),
    ("bfio", "placement"): Bench("BF-IO vs JSQ when ranks are chosen at arrival (the leaf) or at slot-free time",
                                 _bfio_placement, "dlb.bench.bfio_placement:run"),
    ("bfio", "heldrun"): Bench("a data-path run with the leaf's hold queue, replayed in the study's step model",
                               _bfio_heldrun, "dlb.bench.bfio_heldrun:run"),
}


def plain_text(doc: str) -> str:
    """A module docstring as ``--help`` text: reST roles and double backquotes dropped (``:func:`x``` → ``x``)."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return doc.replace("``", "`")


def _runner(target: str) -> Callable[[argparse.Namespace], int]:
    """The bench's run function, imported when the command runs."""

    def run(args: argparse.Namespace) -> int:
        module, func = target.split(":")
        invoked_as(getattr(args, "command_line", None))
        with _sigterm_unwinds() as stopped:
            try:
                return int(getattr(importlib.import_module(module), func)(args) or 0)
            except KeyboardInterrupt:
                print(f"dlb bench: stopped by {stopped[0] if stopped else 'SIGINT'}; what it started is stopped", file=sys.stderr)
                return 143 if stopped else 130

    return run


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[list[str]]:
    """SIGTERM unwinds the bench like Ctrl-C does, so every ``with`` that started a process stops it.

    Python's default SIGTERM action exits at once without running ``finally`` or ``__exit__``: a bench
    killed with SIGTERM left its Envoys, services and emulators running. The list holds the signal's
    name once it arrived.
    """
    stopped: list[str] = []

    def on_term(signum: int, frame: object) -> None:
        if not stopped:
            stopped.append("SIGTERM")
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread (a bench run from a test's thread): nothing to install
        yield stopped
        return
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGTERM, previous)


def add(subparsers: argparse._SubParsersAction, group: str, name: str) -> None:
    """Add the parser of one bench: its options from the table, ``func`` its runner."""
    bench = BENCHES[(group, name)]
    description = None
    formatter: type[argparse.HelpFormatter] = argparse.HelpFormatter
    if bench.description is not None:
        description = plain_text(importlib.import_module(bench.description).__doc__ or "")
        formatter = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(name, help=bench.help, description=description, formatter_class=formatter)
    bench.setup(p)
    p.set_defaults(func=_runner(bench.runner), command_line=None)  # dlb.cli fills in the command line


def _register(group: str, name: str) -> Callable[[argparse._SubParsersAction], None]:
    def register(subparsers: argparse._SubParsersAction) -> None:
        add(subparsers, group, name)

    register.__doc__ = f"``dlb {group} {name}``"
    return register


register_envoy_push = _register("bench", "envoy-push")
register_pick = _register("bench", "pick")
register_overhead = _register("bench", "overhead")
register_xds = _register("bench", "xds")
register_faults = _register("bench", "faults")
register_load = _register("bench", "load")
register_hostile = _register("bench", "hostile")
register_emulator_fidelity = _register("bench", "emulator-fidelity")
register_sim_twin = _register("bench", "sim-twin")
register_bfio_study = _register("bfio", "study")
register_bfio_bench = _register("bfio", "bench")
register_bfio_dataplane = _register("bfio", "dataplane")
register_bfio_placement = _register("bfio", "placement")
register_bfio_heldrun = _register("bfio", "heldrun")


def netns_client_main() -> None:
    """The netns testbed's client process (:func:`dlb.bench.netns_client.start`): a ``ClientLoad`` as JSON
    in ``argv[1]``, one sample per line of JSON out."""
    import dataclasses
    import json
    import sys

    from dlb.bench.netns_client import ClientLoad, run

    for s in run(ClientLoad(**json.loads(sys.argv[1]))):
        print(json.dumps(dataclasses.asdict(s)))

