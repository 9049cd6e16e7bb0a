"""Hosts on one Linux box: a network namespace each, joined by a bridge in a namespace of its own.

Why namespaces: on one machine every DLB process shares 127.0.0.1, so a testbed cannot tell a
service that only works because its peer happens to be on the same host (a leaf checking "its"
Envoy at the cell's public address, a name bound as-is, a loopback address in a config) from one
that works across hosts. In a namespace per host, a process reaches another host only through the
address the config gives, as pods and VMs do.

Layout: ``<prefix>-br`` holds a bridge ``br0`` and nothing else; every host ``<prefix>-<name>`` gets
a veth whose host end is ``eth0`` with an address in 198.18.0.0/24 (RFC 2544 benchmarking space,
never routed), and its own ``lo``. Every link is created inside the namespaces (``ip -n``): nothing
is added to the host namespace. :meth:`Lab.close` (also on ``with`` exit, and on a failure while
building) kills whatever still runs in the namespaces and deletes them; namespaces take their veths
and the bridge with them.

Needs root and ``ip netns`` (iproute2). :func:`unavailable` says why not, for a test's skip reason.
``sch_netem`` is not used (missing on some kernels): WAN delay stays Envoy's fault filter.

Python code reaches a host with :func:`entered`: it moves the calling *thread* into the host's
namespace (``setns(2)``), so a socket created inside stays there after the thread comes back.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = ipaddress.ip_network("198.18.0.0/24")
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/run/netns"
_ETC_NETNS = "/etc/netns"


def unavailable() -> str | None:
    """Why namespaces cannot be built here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2 'ip' not found"
    probe = f"dlb-probe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True, timeout=30)
    return None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    """One namespace: ``name`` in the lab, ``ns`` as ``ip netns`` knows it, ``ip`` on the bridge."""

    name: str
    ns: str
    ip: str

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: same pid, signals reach it)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def pod_argv(self, argv: list[str], tmp: Path) -> list[str]:
        """``argv`` in this host with ``tmp`` mounted on ``/tmp``: a pod's ``emptyDir`` scratch, which its
        containers share and no other pod sees (a leaf's access-log socket is under ``/tmp``). ``ip netns
        exec`` runs it in a mount namespace of its own, so the mount stays there; ``sh`` execs, same pid.

        What the pod runs may itself live under ``/tmp`` (a CI's fresh clone and its venv): those entries
        are bound into the scratch first, so the new ``/tmp`` still shows them (:func:`programs_under_tmp`).
        """
        keep = "".join(f'mkdir -p "$0"/{q} && mount --bind /tmp/{q} "$0"/{q} && '
                       for q in map(shlex.quote, programs_under_tmp()))
        # --rbind: a plain bind of the scratch would leave the entries bound into it behind.
        return self.argv(["sh", "-c", keep + 'mount --rbind "$0" /tmp && exec "$@"', str(tmp), *argv])


def programs_under_tmp() -> list[str]:
    """The top-level entries of ``/tmp`` holding this Python's environment or the ``dlb`` package."""
    import dlb

    keep = set()
    for place in (Path(sys.prefix), Path(dlb.__file__).parent.parent):
        parts = place.resolve().parts
        if len(parts) > 2 and parts[:2] == ("/", "tmp"):
            keep.add(parts[2])
    return sorted(keep)


@dataclass
class Lab:
    """Hosts on a bridge. ``with Lab(["cp", "root", "cell-a"]) as lab: lab.hosts["cp"].ip``."""

    names: list[str]
    prefix: str = field(default_factory=lambda: f"dlb{uuid.uuid4().hex[:6]}")
    hosts: dict[str, Host] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)  # namespaces, in creation order

    def __post_init__(self) -> None:
        if len(self.names) > SUBNET.num_addresses - 3:
            raise ValueError(f"at most {SUBNET.num_addresses - 3} hosts in {SUBNET}, got {len(self.names)}")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"host names must be unique: {self.names}")

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def build(self) -> Lab:
        try:
            self._add_ns(self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            for k, name in enumerate(self.names):
                host = Host(name, f"{self.prefix}-{name}", str(SUBNET.network_address + 2 + k))
                self._add_ns(host.ns)
                # Both ends are made in the bridge's namespace and one moves into the host: the host
                # namespace of the machine never sees either.
                _ip("-n", self.bridge_ns, "link", "add", f"v{k}", "type", "veth", "peer", "name", "eth0", "netns", host.ns)
                _ip("-n", self.bridge_ns, "link", "set", f"v{k}", "master", "br0", "up")
                _ip("-n", host.ns, "addr", "add", f"{host.ip}/{SUBNET.prefixlen}", "dev", "eth0")
                _ip("-n", host.ns, "link", "set", "eth0", "up")
                self.hosts[name] = host
        except BaseException:
            self.close()
            raise
        return self

    def pids(self, ns: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def close(self, grace_s: float = 3.0) -> None:
        """Kill what still runs in the lab's namespaces (TERM, then KILL), then delete them. Idempotent."""
        live = [ns for ns in self.created if os.path.exists(f"{_NETNS_DIR}/{ns}")]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [p for ns in live for p in self.pids(ns)]
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
            end = time.monotonic() + grace_s
            while pids and time.monotonic() < end and any(self.pids(ns) for ns in live):
                time.sleep(0.05)
        for ns in reversed(live):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=30)
            shutil.rmtree(f"{_ETC_NETNS}/{ns}", ignore_errors=True)
        self.created = [ns for ns in self.created if os.path.exists(f"{_NETNS_DIR}/{ns}")]
        shutil.rmtree(self.scratch, ignore_errors=True)

    def use_nameserver(self, ip: str) -> None:
        """Make ``ip`` every host's DNS server: ``ip netns exec`` mounts ``/etc/netns/<ns>/resolv.conf``
        over ``/etc/resolv.conf`` for what it runs (removed again by :meth:`close`)."""
        for host in self.hosts.values():
            folder = Path(_ETC_NETNS) / host.ns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "resolv.conf").write_text(f"nameserver {ip}\noptions timeout:1 attempts:3\n")

    @property
    def scratch(self) -> Path:
        """A folder of the lab's outside ``/tmp`` (a pod's ``/tmp`` is mounted over it, :func:`pod_argv`)."""
        return Path("/run") / f"{self.prefix}-lab"

    def __enter__(self) -> Lab:
        return self.build() if not self.created else self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lab_namespaces(prefix: str) -> list[str]:
    """Namespaces of a lab still present (the check that a run left nothing behind)."""
    try:
        return sorted(n for n in os.listdir(_NETNS_DIR) if n.startswith(prefix + "-"))
    except FileNotFoundError:
        return []


_LIBC = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(host: Host) -> Iterator[None]:
    """Run the block with this thread in ``host``'s network namespace (sockets made here stay there)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"{_NETNS_DIR}/{host.ns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int
    cmdline: str  # of the owning process, space-joined ("" if it is gone)


def listeners(host: Host) -> list[Listener]:
    """TCP listening sockets in ``host`` and the processes owning them (``ss -ltnp`` inside it)."""
    out = subprocess.run(host.argv(["ss", "-Hltnp"]), check=False, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ss in {host.ns}: {out.stderr.strip()}")
    found = []
    for line in out.stdout.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        addr, _, port = cols[3].rpartition(":")
        m = re.search(r"pid=(\d+)", line)
        pid = int(m.group(1)) if m else 0
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip() if pid else ""
        except OSError:
            cmdline = ""
        found.append(Listener(addr.strip("[]"), int(port), pid, cmdline))
    return found
