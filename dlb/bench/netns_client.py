"""Load from the netns testbed's ``client`` host: :func:`dlb.bench.faults.traced_open_loop` in a process there.

Why a process of its own: the client dials the root Service by name, and only a process that
``ip netns exec`` started sees the host's ``/etc/resolv.conf`` (the stub DNS server); a thread of the
test's process that entered the namespace still reads the machine's. Each new connection resolves
the name again and dials one of its addresses at random, the others if it is refused: the spread a
Service's virtual IP gives (kube-proxy picks a pod per connection), which ``getaddrinfo``'s own order
would not (RFC 6724 sorts by common prefix length: every connection went to one root pod). Times are ``CLOCK_MONOTONIC``,
which every process on the machine shares: the caller schedules faults on the same clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass

from dlb.bench.faults import Sample
from dlb.testbed.netns import Host


@dataclass(frozen=True)
class ClientLoad:
    """Poisson traffic of :data:`dlb.bench.faults.MIX` to ``host:port`` from ``origin`` (monotonic s) for ``duration_s``."""

    host: str
    port: int
    origin: float
    rate: float = 20.0
    duration_s: float = 20.0
    seed: int = 1
    max_tokens: int = 8
    long_tokens: int = 500


def run(load: ClientLoad) -> list[Sample]:
    """Send ``load`` from this process; samples' times are seconds after ``load.origin``."""
    from dlb.bench.faults import request_mix, traced_open_loop

    mix = request_mix(load.host, load.port, load.max_tokens, load.long_tokens)
    return asyncio.run(traced_open_loop(load.host, load.port, mix, load.rate, load.duration_s, load.seed, [], load.origin,
                                        spread=True))


def start(host: Host, load: ClientLoad) -> subprocess.Popen[str]:
    """:func:`run` in ``host``; :func:`collect` reads its samples."""
    code = "from dlb.bench.cli import netns_client_main; netns_client_main()"
    return subprocess.Popen(host.argv([sys.executable, "-c", code, json.dumps(dataclasses.asdict(load))]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(proc: subprocess.Popen[str], timeout_s: float) -> list[Sample]:
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"netns client exited with {proc.returncode}: {err[-2000:]}")
    return [Sample(**json.loads(line)) for line in out.splitlines() if line.startswith("{")]
