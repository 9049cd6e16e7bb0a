"""A leaf a prober polls: which cell, where, and the WAN delay a one-machine testbed adds.

Why a module of its own: the client polls targets and the codec checks answers against them; both
import it, neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeTarget:
    index: int  # cell index in the topology
    name: str  # cell name (the leaf must answer with the same name)
    address: str  # host:port of the leaf agent's probe service
    #: Testbeds on one machine: one-way delay to add each way (the WAN the requests are delayed by),
    #: so the root's view of a remote cell is as old as it would be over the real network.
    emulated_one_way_s: float = 0.0
