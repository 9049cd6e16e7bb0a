"""The leaf's starting state from the DLB config: its servers (DNS names expanded, data-parallel ranks
spelled out), the latency prior and the pick rule.

Why a module of its own: the agent's runner and its xDS sync (which applies ``DpGroups`` as the file's
``servers[].dp_*`` would be) both build state this way; in the service module they imported each other.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dlb.config import Config
from dlb.config.model import DpGroup, leaf_deadline_s
from dlb.core.bfio import DpBalancer
from dlb.core.estimator import EstimatorConfig
from dlb.core.hold_queue import HoldQueue
from dlb.core.server_pick import PrequalConfig
from dlb.envoy.contract import SERVER_CHECK_INTERVAL_S, SERVER_CHECK_JITTER_S
from dlb.ext_proc.leaf_state import LeafState, ServerState

#: How long a recovered server waits before the probes count it (``LeafState.rejoin_hold_s``): the leaf
#: Envoy's health-check period and jitter, plus 0.2 s for the check's own round trip and this loop's lateness.
REJOIN_HOLD_S = SERVER_CHECK_INTERVAL_S + SERVER_CHECK_JITTER_S + 0.2


def _ip_address(host: str, port: int) -> str:
    """``ip:port`` of a server address that is an IP: Envoy's ORIGINAL_DST cluster and the access log speak IPs."""
    import ipaddress

    ip = ipaddress.ip_address(host)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def resolve_all_sync(host: str, port: int) -> list[str]:
    """Every IP of ``host`` (A and AAAA); raises OSError naming it when it has none."""
    import socket

    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
def dp_balancer(dp: DpGroup) -> DpBalancer:
    """The rank picker of one data-parallel server, from its config (file or xDS DpGroups)."""
    return DpBalancer(ranks=dp.ranks, policy=dp.policy, horizon=dp.horizon, mean_decode_tokens=dp.mean_decode_tokens,
                      slots=dp.max_num_seqs, hold_early=dp.hold_early,
                      hold=HoldQueue(dp.hold_queue, dp.hold_deadline_ms / 1000.0) if dp.hold_queue > 0 else None)


def rank_addresses(host: str, port: int, ranks: int) -> list[str]:
    """The leaf's keys of a DP server's ranks (rank r on port + r), as its server list spells them."""
    return [_ip_address(host, port + r) for r in range(ranks)]


def state_from_config(cfg: Config, cell_name: str, choices: int = 2, seed: int | None = None,
                      refit_period_s: float = 5.0, window_s: float = 60.0, pick_rule: str = "prequal",
                      resolve: Callable[[str, int], list[str]] = resolve_all_sync) -> LeafState:
    """The leaf's starting state. A server named by DNS stands for every address the name has now
    (a headless Service: one per pod), as the control plane's discovery publishes them; with ``--xds``
    the agent then follows those updates over EDS."""
    from dlb.config.discovery import dns_names, expand

    names = {h: p for h, p in dns_names(cfg).items() if any(s.address.host == h for s in cfg.cell(cell_name).servers)}
    cfg = expand(cfg, {h: resolve(h, p) for h, p in names.items()})
    cell = cfg.cell(cell_name)
    # The cell serves every endpoint with the same servers: one cell-wide model, prior of the first endpoint here.
    prior = cfg.endpoints[0].prior_for(cell_name).to_core()
    servers: list[ServerState] = []
    dp_groups: list[tuple[DpBalancer, list[str]]] = []
    for s in cell.servers:
        ranks = [ServerState(_ip_address(a.host, a.port), float(s.weight)) for a in s.rank_addresses()]
        servers += ranks
        if s.dp is not None:
            dp_groups.append((dp_balancer(s.dp), [r.address for r in ranks]))
    return LeafState(cell=cell.name, servers=servers, replicas=cell.replicas, prior=prior, choices=choices, dp_groups=dp_groups,
                     estimator_config=EstimatorConfig(window_s=window_s, refit_period_s=refit_period_s),
                     rng=np.random.default_rng(seed), pick_rule=pick_rule, rejoin_hold_s=REJOIN_HOLD_S,
                     prequal=PrequalConfig(probes_per_pick=choices, pool_size=max(16, choices)),
                     admission=cfg.policy.leaf.admission.to_core(leaf_deadline_s(cfg.endpoints)))

