"""Emulated OpenAI-compatible GPU inference server (see docs/emulator.md).

- :mod:`dlb.emulator.profile` — step-time profiles (pure), built-ins and loading.
- :mod:`dlb.emulator.engine` — the continuous-batching scheduler model (pure, fake-clock testable).
- :mod:`dlb.emulator.openai` — request parsing and response bodies (pure).
- :mod:`dlb.emulator.prefix_cache` — automatic prefix caching model (pure, optional).
- :mod:`dlb.emulator.faults` — fault knobs; :mod:`dlb.emulator.metrics` — vLLM-named metrics.
- :mod:`dlb.emulator.server` — the aiohttp service: ``EmulatorServer`` (async) and ``ThreadedEmulator``.
- :mod:`dlb.testbed.emulator` — ``EmulatorProcess``: the same as a child process on a free port.
- :mod:`dlb.emulator.client` — admin API helpers (``set_faults`` …, given the admin port's URL); :mod:`dlb.emulator.cli` — the command.
- :mod:`dlb.bench.emulator_fidelity` — measures a live emulator against its own model.
"""

from dlb.emulator.engine import Arrival, Engine, EngineRequest, simulate
from dlb.emulator.faults import Faults
from dlb.emulator.profile import BUILTIN_PROFILES, Profile, load_profile
from dlb.emulator.server import SERVER_HEADER, EmulatorConfig, EmulatorServer, ThreadedEmulator

__all__ = [
    "BUILTIN_PROFILES",
    "SERVER_HEADER",
    "Arrival",
    "EmulatorConfig",
    "EmulatorServer",
    "Engine",
    "EngineRequest",
    "Faults",
    "Profile",
    "ThreadedEmulator",
    "load_profile",
    "simulate",
]
