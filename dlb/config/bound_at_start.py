"""What a reload cannot apply: the fields a running control plane bound when it started.

Its own listeners and credentials are bound once, so a changed value there needs a restart; the control
plane warns on reload (``config_reload_needs_restart``) and ``dlb up`` refuses such a reload.
"""

from __future__ import annotations

from dlb.config.model import Config


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """The fields changed between ``old`` and ``new`` that a running control plane does not apply: its
    own listeners and credentials are bound when it starts."""
    out = [f"services.control_plane.{k}" for k in ("xds", "status")
           if getattr(old.services.control_plane, k) != getattr(new.services.control_plane, k)]
    if old.tls != new.tls:
        out.append("tls")
    return out
