"""Where an endpoint's latency prior acts, and a warning where it is set but cannot.

Why: a cell's servers serve every endpoint, so its leaf fits one cell-wide latency model from all of
their requests, starting from the *first* endpoint's prior (``leaf_setup``, the control plane's fleet
prior); the roots replace each endpoint's curve with that model at the cell's first probe. A later
endpoint's ``latency_prior`` / ``latency_prior_by_cell`` therefore shapes its routing only until then.
A stranger set a slower region's prior on a second endpoint and saw it ignored: valid config, so it is
said, not refused (configs that give every endpoint the same prior stay quiet).
"""

from __future__ import annotations

from dlb.config.model import Config, LatencyPrior


def unused_prior_warning(cfg: Config) -> str | None:
    """The later endpoints that set a prior (any but the default) differing from the first endpoint's in some
    cell, or None."""
    if len(cfg.endpoints) < 2:
        return None
    first = cfg.endpoints[0]
    eps = [ep.name for ep in cfg.endpoints[1:]
           if (ep.latency_prior != LatencyPrior() or ep.latency_prior_by_cell)
           and any(ep.prior_for(c) != first.prior_for(c) for c in cfg.cell_names)]
    if not eps:
        return None
    return (f"endpoint(s) {', '.join(eps)}: latency_prior / latency_prior_by_cell differ from the first endpoint's "
            f"({first.name}), which every cell's model starts from (a cell's servers serve every endpoint); theirs acts "
            "only until the cell's first probe: set the prior on the first endpoint")
