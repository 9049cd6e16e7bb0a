"""The overhead benchmark's load from ``wrk`` (a C load generator), when it is installed.

Why: on a 2-core machine the load generator shares the CPU with the system under test. Our asyncio
generator (:mod:`dlb.bench.loadgen`) costs 0.25–0.3 ms of CPU per request in open-loop mode and
its timers have 1 ms resolution (uvloop), both of which land in every latency it reports; wrk costs
a few µs per request. ``apt-get install wrk`` (Debian/Ubuntu) provides it; without it the benchmark
falls back to the Python generator and says so in every record.

Modes, through a Lua script passed to wrk:

- **closed**: ``connections`` connections, each sending its next request when the answer arrives.
- **open**: ``connections`` connections each waiting an exponential think time with mean
  ``connections / rate`` before every request, so arrivals are close to Poisson at ``rate`` while
  latency is small against the think time (it is here: ~1 ms against ≥ 50 ms). wrk measures latency
  from the actual send, so a stalled server would see fewer arrivals (coordinated omission) — the
  reported ``rps`` shows whether the rate was reached.

The script's ``done()`` dumps wrk's whole latency histogram (µs → count) as JSON, so slices of one
configuration pool exactly, as the Python generator's samples do.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from dlb.bench.loadgen import LoadResult

_DELAY = r"""
delay = function()
  return -math.log(1 - math.random()) * think_ms
end
"""

_SCRIPT = r"""
local think_ms = 0
init = function(args)
  -- args: path body_file think_ms seed
  wrk.method = "POST"
  wrk.path = args[1]
  local f = assert(io.open(args[2], "rb")); wrk.body = f:read("*a"); f:close()
  wrk.headers["Content-Type"] = "application/json"
  think_ms = tonumber(args[3])
  math.randomseed(tonumber(args[4]) + math.floor(os.clock() * 1e6))
end
%DELAY%
done = function(summary, latency, requests)
  local out = assert(io.open(os.getenv("DLB_WRK_OUT"), "w"))
  out:write(string.format('{"requests": %d, "duration_us": %d, "status_errors": %d, "socket_errors": %d, "timeouts": %d, "hist": [',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write, summary.errors.timeout))
  -- latency(i) gives the i-th distinct value and its count; past the last one wrk 4.x returns
  -- value 0 (and a non-zero count), so stop on value 0 or once every sample is accounted for.
  local i, seen, first = 1, 0, true
  while i <= 10000000 do
    local v, c = latency(i)
    if v == nil or v == 0 or c == nil or c == 0 then break end
    if not first then out:write(",") end
    out:write(string.format("[%d,%d]", v, c))
    first = false
    seen = seen + c
    if seen >= summary.requests then break end
    i = i + 1
  end
  out:write("]}")
  out:close()
end
"""


def wrk_binary() -> str | None:
    """Path of ``wrk`` (``DLB_WRK`` overrides), or None when it is not installed."""
    return os.environ.get("DLB_WRK") or shutil.which("wrk")


async def run_wrk(host: str, port: int, path: str, body: bytes, connections: int, duration_s: float,
                  rate: float | None = None, seed: int = 1, binary: str | None = None) -> tuple[LoadResult, float]:
    """One wrk run; returns the result and wrk's own CPU seconds (user + system)."""
    exe = binary or wrk_binary()
    if exe is None:
        raise FileNotFoundError("wrk is not installed (apt-get install wrk), or set DLB_WRK")
    think_ms = 0.0 if rate is None else connections / rate * 1000.0
    with tempfile.TemporaryDirectory(prefix="dlb-wrk-") as tmp:
        d = Path(tmp)
        script, body_file, out = d / "load.lua", d / "body", d / "out.json"
        # No delay() at all in closed loop: wrk then sends back to back without a timer per request.
        script.write_text(_SCRIPT.replace("%DELAY%", _DELAY if rate is not None else ""))
        body_file.write_bytes(body)
        # wrk's -d takes whole seconds (s/m/h units, integers): shorter runs are rounded up to 1 s.
        duration = f"{max(1, round(duration_s))}s"
        args = [exe, "-t1", f"-c{connections}", f"-d{duration}", "--timeout", "10s", "-s", str(script),
                f"http://{host}:{port}{path}", "--", path, str(body_file), f"{think_ms:.6f}", str(seed)]
        before = _children_cpu()
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env={**os.environ, "DLB_WRK_OUT": str(out)})
        stdout, stderr = await proc.communicate()
        cpu = _children_cpu() - before  # the benchmark runs one wrk at a time
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"wrk failed ({proc.returncode}): {stderr.decode(errors='replace').strip() or stdout.decode(errors='replace')[-500:]}")
        data = json.loads(out.read_text())
    hist = np.asarray(data["hist"], dtype=np.int64).reshape(-1, 2)
    lat_s = np.repeat(hist[:, 0], hist[:, 1]) / 1e6 if len(hist) else np.zeros(0)
    errors = int(data["status_errors"]) + int(data["socket_errors"]) + int(data["timeouts"])
    # wrk keeps a response with status > 399 in its latency histogram too and does not say which
    # status it was (that would need a Lua response() callback, which makes wrk parse every
    # response). So per-status counts stay empty and any error shows in ``errors``, which the
    # benchmark's records carry (and its smoke test requires to be 0).
    return LoadResult(lat_s, errors, data["duration_us"] / 1e6, {}), cpu


def _children_cpu() -> float:
    """User + system CPU seconds of this process's reaped children (wrk, once asyncio reaped it)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
