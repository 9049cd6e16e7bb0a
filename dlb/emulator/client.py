"""Small synchronous client for an emulator's admin API (fault tests, testbed scripts).

Works the same for in-process, threaded and child-process emulators, and for several at once: it only
needs the base URL.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def _call(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def get_faults(base_url: str) -> dict[str, Any]:
    """Current fault knobs of the emulator whose admin API is at ``base_url`` (``--admin-port``, e.g. ``http://127.0.0.1:8001``)."""
    return _call("GET", base_url.rstrip("/") + "/admin/faults")


def set_faults(base_url: str, **changes: Any) -> dict[str, Any]:
    """Change some knobs (``error_rate``, ``error_status``, ``slowdown``, ``extra_latency_ms``, ``down``);
    returns the full new settings. An invalid value raises ``urllib.error.HTTPError`` (400)."""
    return _call("POST", base_url.rstrip("/") + "/admin/faults", changes)


def reset_faults(base_url: str) -> dict[str, Any]:
    """Back to a healthy server (all knobs at their defaults)."""
    return _call("DELETE", base_url.rstrip("/") + "/admin/faults")


def get_state(base_url: str) -> dict[str, Any]:
    """Scheduler snapshot: running, waiting, kv_usage, steps, faults, profile, config."""
    return _call("GET", base_url.rstrip("/") + "/admin/state")
