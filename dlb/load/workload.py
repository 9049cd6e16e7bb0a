"""Seeded open-loop OpenAI workloads: arrival times, lengths and multi-turn sessions, fixed in advance.

Pure (no I/O, no clock): the same seed gives the same requests, so ``dlb demo --compare`` can run one
workload against every policy and ``dlb load --trace`` can replay it. Open loop means no arrival
depends on a response: a slow fleet gets the same requests at the same times as a fast one, which
is what makes latencies comparable (closed-loop generators hide overload by slowing down).

Shape (defaults; every number is a field of :class:`WorkloadSpec`):
- chat: sessions start as a Poisson process; a session has Geometric (>= 1) turns (mean ``chat_turns``),
  separated by exponential think times; each turn's prompt is the conversation so far (previous
  prompt + previous answer + a new user message), so later turns are longer — and benefit from the
  server that holds their prefix (what session affinity is for);
- completions: independent Poisson arrivals, no session;
- lengths: log-normal prompt and output lengths (medians and spreads below, capped), the usual fit
  to production LLM traces (e.g. the Azure LLM inference traces and BurstGPT report heavy-tailed,
  roughly log-normal token counts);
- each request enters at a source cell drawn from ``sources`` (weights).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload. ``t`` is seconds after the start; ``session`` is "" for none."""

    t: float
    endpoint: str  # "chat" | "completions"
    source: str
    prompt_tokens: int
    max_tokens: int
    session: str = ""
    turn: int = 0

    @property
    def path(self) -> str:
        return CHAT_PATH if self.endpoint == "chat" else COMPLETIONS_PATH


@dataclass(frozen=True)
class WorkloadSpec:
    rate_rps: float  # mean request rate over the run (both endpoints)
    duration_s: float
    sources: dict[str, float] = field(default_factory=dict)  # source cell -> weight
    chat_fraction: float = 0.6
    chat_turns: float = 3.0  # mean turns per session
    think_s: float = 4.0  # mean gap between turns of a session
    prompt_median: float = 300.0
    prompt_sigma: float = 0.8
    turn_median: float = 60.0  # new user tokens per later turn
    output_median: float = 80.0
    output_sigma: float = 0.6
    max_prompt: int = 4000
    max_output: int = 400
    seed: int = 1

    def __post_init__(self) -> None:
        if not self.rate_rps > 0 or not math.isfinite(self.rate_rps):
            raise ValueError(f"rate_rps: must be > 0, got {self.rate_rps}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s: must be > 0, got {self.duration_s}")
        if not 0 <= self.chat_fraction <= 1:
            raise ValueError(f"chat_fraction: must be in [0, 1], got {self.chat_fraction}")
        if self.chat_turns < 1:
            raise ValueError(f"chat_turns: must be >= 1, got {self.chat_turns}")
        if not self.sources or any(w < 0 for w in self.sources.values()) or sum(self.sources.values()) <= 0:
            raise ValueError(f"sources: need at least one source cell with a positive weight, got {self.sources}")

    def warm_up_s(self) -> float:
        """How long before the start sessions begin: long enough that a session still under way at the
        start after that long has probability ~0 (a session lasts (turns - 1) think times on average)."""
        return 20.0 * self.think_s * (self.chat_turns - 1.0)

    def mean_output(self) -> float:
        """Mean of the capped log-normal output length (what capacity is computed from)."""
        return float(min(self.max_output, self.output_median * math.exp(self.output_sigma ** 2 / 2)))


def generate(spec: WorkloadSpec) -> list[WorkloadRequest]:
    """Every request of the run, sorted by arrival time."""
    rng = np.random.default_rng(spec.seed)
    names = list(spec.sources)
    w = np.array([spec.sources[n] for n in names], dtype=float)
    w /= w.sum()
    out: list[WorkloadRequest] = []

    def lognormal(median: float, sigma: float, cap: int) -> int:
        return int(min(cap, max(1, round(rng.lognormal(math.log(median), sigma)))))

    # Completions: a Poisson process at the non-chat share of the rate.
    rate_c = spec.rate_rps * (1 - spec.chat_fraction)
    t = 0.0
    while rate_c > 0:
        t += rng.exponential(1 / rate_c)
        if t >= spec.duration_s:
            break
        out.append(WorkloadRequest(t, "completions", names[rng.choice(len(names), p=w)],
                                   lognormal(spec.prompt_median, spec.prompt_sigma, spec.max_prompt),
                                   lognormal(spec.output_median, spec.output_sigma, spec.max_output)))
    # Chat: sessions at rate / mean turns, so requests arrive at the chat share of the rate. Sessions
    # start from ``-warm_up_s`` on and only their turns inside [0, duration) are kept: the run is a
    # window onto a steady stream of conversations. Started at 0, no conversation was under way at the
    # start while the turns past the end were cut, so a run offered less than its rate (-6 % over 60 s,
    # about -40 % over 5 s with the defaults).
    rate_s = spec.rate_rps * spec.chat_fraction / spec.chat_turns
    t = -spec.warm_up_s()
    k = 0
    while rate_s > 0:
        t += rng.exponential(1 / rate_s)
        if t >= spec.duration_s:
            break
        k += 1
        session = f"s{spec.seed}-{k}"
        source = names[rng.choice(len(names), p=w)]
        turns = int(rng.geometric(1 / spec.chat_turns))  # >= 1, mean chat_turns
        prompt = lognormal(spec.prompt_median, spec.prompt_sigma, spec.max_prompt)
        tt = t
        for turn in range(turns):
            if tt >= spec.duration_s:
                break
            answer = lognormal(spec.output_median, spec.output_sigma, spec.max_output)
            if tt >= 0:
                out.append(WorkloadRequest(tt, "chat", source, min(prompt, spec.max_prompt), answer, session, turn))
            prompt += answer + lognormal(spec.turn_median, spec.prompt_sigma, spec.max_prompt)
            tt += rng.exponential(spec.think_s)
    out.sort(key=lambda r: r.t)
    return out


def with_phases(base: list[WorkloadRequest], phases: list[tuple[float, WorkloadSpec]]) -> list[WorkloadRequest]:
    """``base`` plus each phase's own requests shifted to start at its offset (seconds), sorted by time.

    How a scenario raises the arrival rate for a while (a burst, an overload phase) without changing
    one request of the base workload: a phase is a workload of its own (its own seed and sessions).
    """
    out = list(base)
    for start, spec in phases:
        out += [replace(r, t=r.t + start, session=r.session and f"{r.session}@{start:g}") for r in generate(spec)]
    out.sort(key=lambda r: r.t)
    return out


def write_trace(requests: list[WorkloadRequest], path: str | Path) -> None:
    """JSON lines, one request each (the format ``dlb load --trace`` reads)."""
    with open(path, "w") as fh:
        fh.writelines(json.dumps(asdict(r)) + "\n" for r in requests)


def read_trace(path: str | Path) -> list[WorkloadRequest]:
    """Read a trace; a bad line is reported with file:line and the field."""
    out: list[WorkloadRequest] = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d: dict[str, Any] = json.loads(line)
                out.append(WorkloadRequest(t=float(d["t"]), endpoint=str(d.get("endpoint", "chat")),
                                           source=str(d.get("source", "")), prompt_tokens=int(d["prompt_tokens"]),
                                           max_tokens=int(d["max_tokens"]), session=str(d.get("session", "")),
                                           turn=int(d.get("turn", 0))))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: bad trace record ({type(e).__name__}: {e})") from None
            if out[-1].endpoint not in ("chat", "completions"):
                raise ValueError(f"{path}:{n}: endpoint: must be 'chat' or 'completions', got {out[-1].endpoint!r}")
    out.sort(key=lambda r: r.t)
    return out
