"""The package layout's import direction: core ← config ← services ← launchers/benchmarks.

Every ``import`` in ``dlb/`` (including ones inside functions) is checked against the table below, so a
module that reaches "up" — the routing core importing a service, the generic xDS library importing DLB's
control plane, a service importing a benchmark — fails here instead of growing into a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dlb"

FOUNDATION = {"errors", "gc_heap", "log", "metric_catalogue", "procutil", "proto", "provenance", "resumable"}
#: package → the packages it may import (besides itself). Foundations import nothing but each other.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "metric_catalogue": set(),
    "log": set(),
    "procutil": set(),
    "gc_heap": set(),
    "provenance": set(),
    "resumable": set(),
    "proto": set(),
    "core": {"errors", "resumable"},
    "xds": {"log", "errors"},
    "config": {"core", "xds", "proto", "log", "errors"},
    "envoy": {"config", "core"} | FOUNDATION,
    "emulator": {"log", "procutil", "errors"},
    "load": set(),
    "sim": {"core", "config", "emulator"} | FOUNDATION,
    "ext_proc": {"core", "config", "envoy", "xds"} | FOUNDATION,
    "control_plane": {"core", "config", "envoy", "xds", "ext_proc"} | FOUNDATION,
    "testbed": {"core", "config", "envoy", "xds", "ext_proc", "control_plane", "emulator", "sim", "load"} | FOUNDATION,
    "bench": {"core", "config", "envoy", "xds", "ext_proc", "control_plane", "emulator", "sim", "testbed", "load"} | FOUNDATION,
}
#: Command modules (``dlb/cli.py``, ``dlb/__main__.py`` and each package's ``cli.py``) sit on top and
#: may import anything.
COMMANDS = "cli"
#: Finer rules inside the data plane: the transport knows gRPC framing, not DLB.
MODULE_RULES: dict[str, set[str]] = {"dlb.ext_proc.transport": {"dlb.log", "dlb.errors"}}


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name == "dlb" or a.name.startswith("dlb.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "dlb":  # ``from dlb import log`` names a module
                out += [(node.lineno, f"dlb.{a.name}") for a in node.names]
            elif node.module.startswith("dlb."):
                out.append((node.lineno, node.module))
    return out


def violations(root: Path = ROOT) -> list[str]:
    """Every import in ``root`` that the tables do not allow, as ``file:line: a -> b``."""
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        mod = _module_name(path, root)
        src = _package_of(mod)
        is_command = mod in ("dlb.cli", "dlb.__main__", "dlb") or mod.endswith(f".{COMMANDS}")
        for line, target in _imports(path):
            dst = _package_of(target)
            where = f"{path.relative_to(root.parent)}:{line}: {mod} -> {target}"
            if is_command or dst in ("", src):
                pass
            elif src not in ALLOWED:
                bad.append(f"{where} (package {src!r} has no row in ALLOWED)")
                continue
            elif dst not in ALLOWED[src]:
                bad.append(where)
                continue
            for prefix, allowed in MODULE_RULES.items():
                if (mod == prefix or mod.startswith(prefix + ".")) and not (
                        target.startswith(prefix) or any(target == a or target.startswith(a + ".") for a in allowed)):
                    bad.append(f"{where} (module rule for {prefix})")
    return bad


def test_every_import_points_down_the_layers() -> None:
    """A package imports only the packages its row in ALLOWED names; commands may import anything."""
    assert violations() == []


def test_every_package_has_a_row() -> None:
    """A new package must say where it sits before anything may import it."""
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__", COMMANDS)}
    assert packages | modules <= set(ALLOWED)


def test_the_allowed_edges_have_no_cycle() -> None:
    """The table itself is a DAG: no two packages may import each other, even through others."""
    seen: dict[str, int] = {}

    def visit(p: str, stack: tuple[str, ...]) -> None:
        if seen.get(p) == 2:
            return
        assert seen.get(p) != 1, f"cycle: {' -> '.join(stack + (p,))}"
        seen[p] = 1
        for q in ALLOWED[p]:
            visit(q, stack + (p,))
        seen[p] = 2

    for p in ALLOWED:
        visit(p, ())


@pytest.mark.parametrize("package, planted", [
    ("core", "from dlb.ext_proc.root import RootService\n"),
    ("xds", "from dlb.control_plane.service import ControlPlane\n"),
    ("ext_proc", "import dlb.bench.overhead\n"),
    ("ext_proc/transport", "from dlb.config import Config\n"),
])
def test_a_planted_upward_import_is_caught(tmp_path: Path, package: str, planted: str) -> None:
    """The check can fail: a copy of the tree with one forbidden import reports exactly that import."""
    import shutil

    copy = tmp_path / "dlb"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / package / "planted.py").write_text(planted)
    found = violations(copy)
    assert len(found) == 1 and "planted.py" in found[0], found
