"""Pure routing core shared by the services and the simulator.

No I/O and no hidden clocks: every function that depends on time takes ``now`` (seconds) or ``dt``
as an argument, so the simulator can run it in simulated time and tests can pin it exactly.
"""

from dlb.control_plane.topology import Topology

__all__ = ["Topology"]
