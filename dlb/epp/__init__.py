"""``dlb serve epp``: the leaf agent as a Gateway API Inference Extension endpoint picker (EPP).

A GIE gateway (Envoy Gateway, kgateway, Istio, GKE, or a plain Envoy configured like them) asks its
InferencePool's EPP over ext_proc which pod gets each request. This package speaks that contract
(:mod:`dlb.epp.protocol`) around the leaf's own picking, counting and fit (:class:`~dlb.ext_proc.leaf_state.LeafState`),
so one pool gets DLB's pick and a DLB root can probe it as one of its cells.
"""
