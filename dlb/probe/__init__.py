"""The ``dlb.v1.Probe`` protocol between a leaf and its pollers: the client (:mod:`dlb.probe.client`),
the targets it polls (:mod:`dlb.probe.target`) and the codec of the messages (:mod:`dlb.probe.codec`).

Why a package of its own: the roots (data plane) and the control plane both poll leaves. May import
``core`` (the latency model a probe carries) and the foundations (``proto``, ``log``, ``errors``).
"""
