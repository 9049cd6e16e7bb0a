"""What one ``dlb demo`` run is and what it records each second: the types the run, its live view, its
report and ``--compare`` share.

Why a module of its own: the view and the report read these and the demo writes them; defined in
:mod:`dlb.testbed.demo`, they tied the demo, ``compare``, ``view`` and ``report`` into one import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlb.load.generator import Result
from dlb.load.workload import WorkloadSpec
from dlb.testbed.fleet import Fleet

DLB_POLICIES = ("Disc-RIF", "Disc-Lat", "Disc-Grad", "Flow-RIF", "Flow-Lat", "Flow-Grad")
#: Baselines run with no root service: Envoy alone routes, from what the control plane serves. Each
#: maps to the config's ``weights`` plugin (None: Rand as the frozen flow split, ``--no-probe``).
BASELINE_WEIGHTS: dict[str, str | None] = {"Rand": None, "MNLB": "mnlb", "lr-global": "lr-global",
                                           "locality-failover": "locality-failover", "hub-score": "hub-score"}
BASELINE_POLICIES = tuple(BASELINE_WEIGHTS)
#: The discrete policies run by the root Envoy itself (``native-discrete``, pick ``--native-pick``): on
#: request only, as in the simulator.
NATIVE_POLICIES = ("Disc-RIF-native", "Disc-Lat-native", "Disc-Grad-native")
#: What ``--compare`` runs when ``--policies`` is not given.
DEFAULT_POLICIES = (*BASELINE_POLICIES, *DLB_POLICIES)
ALL_POLICIES = (*DEFAULT_POLICIES, *NATIVE_POLICIES)


def native_label(policy: str, pick: str) -> str:
    """A native policy as reports and records name it: with its pick, which changes what it does."""
    return f"{policy} ({pick})"


@dataclass
class Sample:
    """One second of the run as the control plane and the roots saw it."""

    t: float
    fleet: dict[str, Any]
    decisions: dict[str, dict[str, float]]  # source cell -> dest cell -> requests its root Envoys sent in the last interval
    done: int
    ok: int


@dataclass
class DemoRun:
    fleet: Fleet
    cfg_dict: dict[str, Any]
    servers: dict[str, list[str]]
    spec: WorkloadSpec
    capacity: dict[str, float]
    degrade_cell: str | None
    degrade_window: tuple[float, float] | None
    policy: str
    #: Posted to the degraded cell's servers at the window's start (default: the fleet's slowdown); its
    #: keys are reset to the emulator's defaults at the end.
    fault: dict[str, Any] | None = None
    #: The workload's extra phases (start offset, spec): bursts and overload phases of ``--compare``.
    phases: list[tuple[float, WorkloadSpec]] = field(default_factory=list)
    #: The client's request timeout: a request unanswered by then failed.
    timeout_s: float = 300.0
    #: Each server's admin API (``--admin-port``, cell -> addresses in ``servers`` order): the degradation goes there.
    admin: dict[str, list[str]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    interrupted: bool = False
    #: Seconds into the workload at which an interruption stopped it (None: it ran to the end).
    stopped_s: float | None = None
