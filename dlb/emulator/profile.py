"""GPU step-time profiles for the emulated inference server (pure: no I/O except explicit loading).

A continuous-batching server runs the model in *engine steps*: every step does one forward pass over
all running sequences (one decode token each) plus a chunk of prompt tokens of newly admitted
requests. The time of one step is what decides every latency the emulator produces, so it is the
only thing a profile describes:

    step_time(batch, prefill_tokens, context) = base
                                                + prefill_slope · prefill_tokens
                                                + decode_slope · batch
                                                + past_knee_slope · max(0, load − knee)
    load = context / ref_context_tokens   (batch when the profile has no context term, or no context is given)

The first three terms are the form of the BLIS simulator's fitted step time (Llama-3.1-8B, H100:
5.753 ms + 17.25 µs × prefill tokens + 6.00 µs × decode tokens). The last term is the
*flat-then-linear* shape measured on real hardware (``h200-llama-step-times.json``, packaged next to
this module): decode step time is flat while the step is bound by fixed per-step costs (weight reads,
kernel launches) and grows linearly once the batch's work outgrows them. Slopes and knee come from the
measurement; the floor comes from a production server (the eager-mode measurement has a 10–19 ms Python
launch floor a CUDA-graph server does not have).

**Context term.** Every measured decode point holds a 1024-token KV context per sequence
(``ref_context_tokens`` = 1024, read from the file's ``ctx``), so the measured "per sequence" past-knee
slope is a cost per 1024 tokens of KV that the step's attention reads: ``load`` is the step's KV context
in units of the measured sequence (8B: 0.442 ms per 1024 tokens = 0.43 µs per KV token, past a knee
of 21.4 × 1024 ≈ 21.9 k tokens; at 1024 tokens per sequence it is the measured curve exactly). Why the
growth is charged to the KV and not to the batch: the prefill points are linear in tokens (8B: 29.7,
29.1, 29.1 µs per token at 1k, 2k and 4k), so per-token dense compute does not grow, and the dense
matmuls of ≤ 128 decode tokens stay bound by the weight read (the floor); and the 1B shape's slope is
half the 8B's (0.218 vs 0.442 ms), as its KV bytes per token are at Llama-3.2-1B's head layout (an
assumption: the file does not record heads). A long context reaches the knee with fewer sequences;
short ones later. Prefill attention over the prompt is not charged apart (no quadratic term visible
up to 4k). Profiles with ``ref_context_tokens`` = 0 have no context term (the step time depends on batch only).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dlb.errors import DlbError

STEP_TIMES_RESOURCE = "h200-llama-step-times.json"


class ProfileError(DlbError, ValueError):
    """A profile or step-time file is malformed; the message names the file and field."""


@dataclass(frozen=True)
class Profile:
    """Step-time model of one GPU serving one model. Times in the field names' units."""

    name: str
    base_ms: float  # fixed cost of every engine step (the "floor")
    prefill_us_per_token: float  # cost of each prompt token computed in a step
    decode_us_per_seq: float  # small per-sequence cost inside the flat region
    batch_knee: float  # sequences per step before compute dominates
    past_knee_ms_per_seq: float  # slope past the knee
    max_batch_tokens: int = 8192  # token budget per step (chunked prefill), like vLLM's max_num_batched_tokens
    kv_cache_tokens: int = 400_000  # KV cache capacity; drives vllm:gpu_cache_usage_perc and admission
    #: KV context per sequence of the measured batch curve: > 0 turns the past-knee term into a
    #: per-KV-token (context) term, ``past_knee_ms_per_seq / ref_context_tokens`` per token; 0: none.
    ref_context_tokens: int = 0
    source: str = ""  # where the numbers come from

    def __post_init__(self) -> None:
        for f in ("base_ms", "prefill_us_per_token", "decode_us_per_seq", "batch_knee", "past_knee_ms_per_seq"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ProfileError(f"profile {self.name!r}: {f}: must be a finite number >= 0, got {v!r}")
        if self.base_ms <= 0:
            raise ProfileError(f"profile {self.name!r}: base_ms: must be > 0 (a step cannot take no time)")
        for f in ("max_batch_tokens", "kv_cache_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ProfileError(f"profile {self.name!r}: {f}: must be an integer >= 1, got {v!r}")
        v = self.ref_context_tokens
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ProfileError(f"profile {self.name!r}: ref_context_tokens: must be an integer >= 0, got {v!r}")

    def step_time(self, batch: int, prefill_tokens: int = 0, context: int | None = None) -> float:
        """Seconds one engine step takes with ``batch`` sequences, ``prefill_tokens`` prompt tokens and
        ``context`` tokens of KV read by its attention (None: ``ref_context_tokens`` per sequence, the
        measured curve)."""
        load = batch if context is None or not self.ref_context_tokens else context / self.ref_context_tokens
        ms = (
            self.base_ms
            + self.prefill_us_per_token * 1e-3 * prefill_tokens
            + self.decode_us_per_seq * 1e-3 * batch
            + self.past_knee_ms_per_seq * max(0.0, load - self.batch_knee)
        )
        return ms * 1e-3

    def decode_run_time(self, batch: int, context: int, steps: int) -> float:
        """Seconds of ``steps`` pure-decode steps of ``batch`` sequences whose KV context starts at
        ``context`` tokens and grows by ``batch`` (one token each) per step: the sum of their
        :meth:`step_time`, in closed form (the simulator runs up to hundreds of such steps at once)."""
        if steps == 1 or not self.ref_context_tokens:
            return steps * self.step_time(batch, 0, context)
        ref = self.ref_context_tokens
        e0 = context - self.batch_knee * ref  # KV tokens past the knee at the first step
        first = 0 if e0 > 0 else min(steps, math.floor(-e0 / batch) + 1)  # first step past the knee
        n = steps - first
        past = n * e0 + batch * (first + steps - 1) * n / 2.0  # Σ over those steps of (e0 + i·batch)
        ms = steps * (self.base_ms + self.decode_us_per_seq * 1e-3 * batch) + self.past_knee_ms_per_seq * past / ref
        return ms * 1e-3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, origin: str = "<profile>") -> Profile:
        """Build from a JSON object; every unknown or missing key is an error naming ``origin``."""
        if not isinstance(data, dict):
            raise ProfileError(f"{origin}: expected a JSON object with profile fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProfileError(f"{origin}: {unknown[0]}: unknown profile field (known: {', '.join(sorted(known))})")
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = sorted(k for k in required if k not in data)
        if missing:
            raise ProfileError(f"{origin}: {missing[0]}: required profile field is missing")
        try:
            return cls(**data)
        except ProfileError as e:
            raise ProfileError(f"{origin}: {e}") from None
        except TypeError as e:
            raise ProfileError(f"{origin}: {e}") from None


def _linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = slope·x + intercept (kept dependency-free: this module is pure)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def _median(vs: list[float]) -> float:
    s = sorted(vs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def profile_from_step_times(
    data: dict[str, Any],
    model: str,
    *,
    name: str | None = None,
    base_ms: float | None = None,
    decode_us_per_seq: float = 0.0,
    prefill_us_per_token: float | None = None,
    origin: str = STEP_TIMES_RESOURCE,
    rise: float = 1.15,
) -> Profile:
    """Derive a profile from measured step times (the ``h200-llama-step-times.json`` format).

    Decode: the floor is the median step time at batch <= 16; points more than ``rise`` × floor are
    the linear (compute-bound) part, fitted by least squares; the knee is where that line meets the
    floor. Prefill: the slope of the points above the floor (through the origin if only one is).
    ``base_ms`` (and optionally the prefill slope) replace the measured values, so a profile can take
    the measured shape and a production server's floor.
    """
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        raise ProfileError(f"{origin}: runs: expected a list of measured runs")
    run = next((r for r in runs if isinstance(r, dict) and r.get("model") == model), None)
    if run is None:
        have = [r.get("model") for r in runs if isinstance(r, dict)]
        raise ProfileError(f"{origin}: runs: no run with model {model!r} (have {have})")
    try:
        dec = [(float(p["batch"]), float(p["ms"])) for p in run["decode"]]
        pre = [(float(p["tokens"]), float(p["ms"])) for p in run["prefill"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"{origin}: runs[{model}]: decode/prefill points need batch|tokens and ms ({e})") from None
    # One context length for every decode point: the past-knee slope is per that many KV tokens.
    ctxs = {p.get("ctx") for p in run["decode"]}
    ref_ctx = next(iter(ctxs)) if len(ctxs) == 1 else 0
    ref_ctx = ref_ctx if isinstance(ref_ctx, int) and not isinstance(ref_ctx, bool) and ref_ctx > 0 else 0
    small = [ms for b, ms in dec if b <= 16]
    if not small:
        raise ProfileError(f"{origin}: runs[{model}].decode: need points with batch <= 16 to find the floor")
    floor = _median(small)
    lin = [(b, ms) for b, ms in dec if ms > rise * floor]
    if len(lin) < 2:
        raise ProfileError(f"{origin}: runs[{model}].decode: need >= 2 points above the floor to fit the slope")
    slope, intercept = _linear_fit([b for b, _ in lin], [ms for _, ms in lin])
    knee = max(0.0, (floor - intercept) / slope)
    pfloor = _median([ms for t, ms in pre if t <= 512] or [min(ms for _, ms in pre)])
    plin = [(t, ms) for t, ms in pre if ms > rise * pfloor]
    if len(plin) >= 2:
        pslope, _ = _linear_fit([t for t, _ in plin], [ms for _, ms in plin])
    else:
        t_max, ms_max = max(pre)
        pslope = ms_max / t_max
    return Profile(
        name=name or f"{model}-measured",
        base_ms=floor if base_ms is None else base_ms,
        prefill_us_per_token=pslope * 1e3 if prefill_us_per_token is None else prefill_us_per_token,
        decode_us_per_seq=decode_us_per_seq,
        batch_knee=round(knee, 2),
        past_knee_ms_per_seq=slope,
        ref_context_tokens=ref_ctx,
        source=f"{origin}: {model} (floor {floor:.2f} ms, knee {knee:.1f}, slope {slope:.3f} ms/seq"
        + (f" at {ref_ctx} tokens of context)" if ref_ctx else ")"),
    )


def packaged_step_times() -> dict[str, Any]:
    """The H200 measurement packaged with dlb (copy of shared/data/h200-llama-step-times.json)."""
    return json.loads(resources.files("dlb.emulator").joinpath(STEP_TIMES_RESOURCE).read_text())


def _builtins() -> dict[str, Profile]:
    data = packaged_step_times()
    return {
        # Llama-3.1-8B on one H100: BLIS's production floor and per-token terms, the H200 measurement's
        # knee and past-knee slope. ~5.8 ms per step at low load (public vLLM benchmarks report ~6.5 ms
        # per output token at concurrency 1), ~25 ms at batch 64.
        "llama-8b-h100": profile_from_step_times(
            data,
            "llama-8b-shape",
            name="llama-8b-h100",
            base_ms=5.753,
            prefill_us_per_token=17.25,
            decode_us_per_seq=6.00,
        ),
        # The raw eager-mode measurement, floor included (what the measured box actually did).
        "llama-8b-h200-eager": profile_from_step_times(data, "llama-8b-shape", name="llama-8b-h200-eager"),
        "llama-1b-h200-eager": profile_from_step_times(data, "llama-1b-shape", name="llama-1b-h200-eager"),
        # Tiny, fast and with a low knee so tests see the flat-then-linear shape at small concurrency.
        "fast-test": Profile(
            name="fast-test",
            base_ms=2.0,
            prefill_us_per_token=2.0,
            decode_us_per_seq=20.0,
            batch_knee=4,
            past_knee_ms_per_seq=1.0,
            max_batch_tokens=4096,
            kv_cache_tokens=100_000,
            source="synthetic, for tests",
        ),
    }


BUILTIN_PROFILES: dict[str, Profile] = _builtins()


def load_profile(spec: str, base_ms: float | None = None) -> Profile:
    """Resolve ``--profile``: a built-in name, a JSON file of profile fields, or ``FILE#MODEL`` for a
    step-time measurement file (``runs`` format). ``base_ms`` overrides the floor of any of them."""
    if spec in BUILTIN_PROFILES:
        prof = BUILTIN_PROFILES[spec]
    else:
        path_s, _, model = spec.partition("#")
        path = Path(path_s)
        if not path.is_file():
            raise ProfileError(
                f"--profile {spec!r}: not a built-in profile ({', '.join(sorted(BUILTIN_PROFILES))}) and no such file"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ProfileError(f"{path}: invalid JSON: {e}") from None
        if isinstance(data, dict) and "runs" in data:
            if not model:
                models = [r.get("model") for r in data["runs"] if isinstance(r, dict)]
                raise ProfileError(f"{path}: step-time file: name the run as {path}#MODEL (one of {models})")
            prof = profile_from_step_times(data, model, name=f"{path.stem}#{model}", origin=str(path))
        else:
            if model:
                raise ProfileError(f"--profile {spec!r}: {path} is a profile, not a step-time file: "
                                   f"'#{model}' names a run of a step-time file only (give {path} alone)")
            if isinstance(data, dict) and "name" not in data:
                data = {"name": path.stem, **data}
            prof = Profile.from_dict(data, origin=str(path))
    if base_ms is not None:
        prof = replace(prof, base_ms=base_ms)
    return prof
