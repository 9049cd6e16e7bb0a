"""DLB for Envoy: distributed two-tier global load balancing for generative-AI inference.

One folder per part of the system; imports point one way (core ← config ← services ← launchers), and
``tests/unit/test_layout.py`` fails on an import against that direction:

- ``dlb.core``: the pure routing algorithms (no I/O, time passed in) and the fluid-model theory check.
- ``dlb.xds``: a generic xDS server, snapshot cache, status registry and client (nothing DLB-specific).
- ``dlb.config``: the DLB config model, its loader, and its wire form (the ``dlb.v1`` xDS resources).
- ``dlb.envoy``: the Envoy binary, bootstrap rendering, header and cluster names Envoy and services share.
- ``dlb.ext_proc``: the data-plane services: root ext_proc, leaf agent, probe client, HTTP/2 transport.
- ``dlb.control_plane``: the DLB control-plane service: flow loop, Envoy resources, ``serve control-plane``.
- ``dlb.emulator``: the emulated OpenAI-compatible GPU server. ``dlb.sim``: the simulator.
- ``dlb.bench``: benchmarks and load generators. ``dlb.testbed``: whole deployments on one machine.
- ``dlb.proto`` (generated ``dlb.v1`` code), ``dlb.log``, ``dlb.procutil``: foundations anyone may use.
"""

__version__ = "0.1.0"
