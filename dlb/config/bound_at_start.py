"""What a reload cannot apply: the fields a running deployment bound when its processes started.

A control plane binds its own listeners and credentials once; a root service reads its probe timing
when it starts (its probe client is not rebuilt by xDS); the Envoys read the root token from their
bootstraps. A changed value there needs a restart: the control plane warns on reload
(``config_reload_needs_restart``) and ``dlb up`` refuses such a reload — a stranger's probe-period
change was reported reloaded while running roots kept the old one and restarted roots took the new.
"""

from __future__ import annotations

from dlb.config.model import Config

#: The probe fields a root service reads only at start (``stale_after_ms`` reaches it with the policies).
PROBE_TIMING = ("period_ms", "timeout_ms", "backoff_max_ms")


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """The fields changed between ``old`` and ``new`` that running processes do not apply."""
    out = [f"services.control_plane.{k}" for k in ("xds", "status")
           if getattr(old.services.control_plane, k) != getattr(new.services.control_plane, k)]
    if old.tls != new.tls:
        out.append("tls")
    out += [f"probe.{k}" for k in PROBE_TIMING if getattr(old.probe, k) != getattr(new.probe, k)]
    if (old.root_token_file, old.root_token) != (new.root_token_file, new.root_token):
        out.append("root_token_file")  # a derived token moves only with addresses, which are named already
    return out
