"""A cell a prober polls: which cell, where, what answers there, and the WAN delay a one-machine testbed adds.

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
    #: ``dlb``: a DLB leaf agent's ``dlb.v1.Probe`` at ``address``; ``vllm`` / ``gie``: a cell DLB does not run,
    #: whose ``scrape`` addresses (its servers', or its endpoint picker's) are read (:mod:`dlb.probe.foreign`).
    source: str = "dlb"
    scrape: tuple[str, ...] = ()
    #: Which leaf replica of the cell answers at ``address`` (0: the cell's ``leaf.probe``; k: ``leaf.replicas[k-1]``).
    replica: int = 0
    #: ``leaf.replicas: dns``: every address ``address``'s name resolves to is a replica (:mod:`dlb.probe.replica_dns`).
    resolve: bool = False
    #: The name a replica found in DNS was resolved from: its server certificate names that, not the IP.
    tls_name: str = ""

    @property
    def key(self) -> tuple[int, int]:
        return self.index, self.replica


@dataclass(frozen=True)
class CellProbe:
    """How one cell is probed, before the prober knows which cells it polls: the parts of a target that
    come from the config (or the control plane's ``Topology``) rather than from the topology's order."""

    address: str
    source: str = "dlb"
    scrape: tuple[str, ...] = ()
    #: The further leaf replicas' probe addresses (each probed; the answers merged into one cell).
    replicas: tuple[str, ...] = ()
    #: Every address ``address`` resolves to is a replica (``leaf.replicas: dns``).
    resolve: bool = False
