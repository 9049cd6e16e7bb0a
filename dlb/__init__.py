"""DLB for Envoy: distributed two-tier global load balancing for generative-AI inference.

Subpackages:
- ``dlb.control_plane``: pure routing algorithms (no I/O, time passed explicitly) and the theory check.
"""

__version__ = "0.1.0"
