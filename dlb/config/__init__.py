"""DLB config: one YAML file describing cells, network, endpoints and their routing policy.

``load_config(path)`` returns a frozen ``Config`` or raises ``ConfigError`` listing every problem;
``dlb config validate FILE`` is the command-line face of the same check. Schema: docs/config.md.
:mod:`dlb.config.resources` is its wire form: the ``dlb.v1`` xDS resources built from it and decoded by
the services. May import ``core``, ``xds`` (type URLs), ``proto`` and the foundations.
"""

from dlb.config.hostport import is_ip
from dlb.config.loader import ConfigError, Problem, config_from_dict, load_config, parse_config, parse_hostport, read_config_text
from dlb.config.model import (
    CELL_CLUSTER_PREFIX,
    AffinityParams,
    AversionParams,
    Cell,
    Config,
    ControlPlaneAddrs,
    Cost,
    Endpoint,
    FlowParams,
    HostPort,
    LatencyPrior,
    Leaf,
    Match,
    Mechanism,
    Network,
    Policy,
    ProbeParams,
    Root,
    RootAddrs,
    Server,
    Services,
)

__all__ = [
    "CELL_CLUSTER_PREFIX",
    "AffinityParams",
    "AversionParams",
    "Cell",
    "Config",
    "ConfigError",
    "ControlPlaneAddrs",
    "Cost",
    "Endpoint",
    "FlowParams",
    "HostPort",
    "LatencyPrior",
    "Leaf",
    "Match",
    "Mechanism",
    "Network",
    "Policy",
    "ProbeParams",
    "Problem",
    "Root",
    "RootAddrs",
    "Server",
    "Services",
    "config_from_dict",
    "is_ip",
    "load_config",
    "parse_config",
    "parse_hostport",
    "read_config_text",
]
