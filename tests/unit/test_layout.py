"""The package layout's import direction: core ← config ← services ← launchers/benchmarks.

Every ``import`` in ``dlb/`` (including ones inside functions) is checked against the table below, so a
module that reaches "up" — the routing core importing a service, the generic xDS library importing DLB's
control plane, a service importing a benchmark — fails here instead of growing into a cycle.

Inside a package the table says nothing, so the module graph is checked too: no two modules of ``dlb/``
may import each other, directly or through others, counting imports inside functions (a deferred import
hides a cycle from Python, not from the reader). Imports under ``if TYPE_CHECKING:`` are left out: they
never run, and annotations may name a type of a module that imports this one.

The routing core stays pure: no module of ``dlb/core`` parses arguments, prints, opens files or exits.
"""

from __future__ import annotations

import ast
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dlb"

FOUNDATION = {"errors", "finite_json", "gc_heap", "log", "metric_catalogue", "procutil", "proto", "provenance", "resumable"}
#: package → the packages it may import (besides itself). Foundations import nothing but each other.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "finite_json": set(),
    "metric_catalogue": set(),
    "log": set(),
    "procutil": set(),
    "gc_heap": set(),
    "provenance": set(),
    "resumable": set(),
    "proto": set(),
    "core": {"errors"},
    "transport": {"log", "errors"},
    "xds": {"log", "errors", "transport"},
    "config": {"core", "xds", "proto", "log", "errors"},
    "envoy": {"config", "core"} | FOUNDATION,
    "emulator": {"log", "procutil", "errors"},
    "service": {"log", "errors", "transport"},
    "probe": {"core"} | FOUNDATION,
    "load": {"finite_json"},
    "sim": {"core", "config", "emulator"} | FOUNDATION,
    "theory": {"core"} | FOUNDATION,
    "ext_proc": {"core", "config", "envoy", "xds", "service", "probe", "transport"} | FOUNDATION,
    "epp": {"core", "config", "envoy", "service", "probe", "ext_proc", "transport"} | FOUNDATION,
    "control_plane": {"core", "config", "envoy", "xds", "service", "probe", "transport"} | FOUNDATION,
    "launch": {"core", "config", "envoy"} | FOUNDATION,
    "testbed": {"core", "config", "envoy", "xds", "service", "probe", "ext_proc", "control_plane", "emulator", "sim", "load",
                "launch", "transport"} | FOUNDATION,
    "bench": {"core", "config", "envoy", "xds", "service", "probe", "ext_proc", "control_plane", "emulator", "sim", "testbed",
              "load", "launch", "transport"} | FOUNDATION,
}
#: Command modules (``dlb/cli.py``, ``dlb/__main__.py`` and each package's ``cli.py``) sit on top and
#: may import anything.
COMMANDS = "cli"
#: Finer rules inside a package (module prefix → what it may import).
MODULE_RULES: dict[str, set[str]] = {}


@functools.cache
def _parse_text(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename=filename)


def _parse(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per (content, file name) for the whole run: the planted-defect
    tests check copies of the tree that differ from it in one file, and re-parsing ~200 unchanged
    modules per copy was most of this file's 20 s. The trees are only read."""
    return _parse_text(path.read_text(encoding="utf-8"), path.name)


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
    tree = _parse(path)
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


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _run_time_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except what sits in an ``if TYPE_CHECKING:`` body (its ``else`` runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _run_time_nodes(other)
            continue
        yield child
        yield from _run_time_nodes(child)


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module → the modules of ``root`` it imports at run time (at the top or inside functions).

    ``from dlb.x import y`` names module ``dlb.x.y`` when that is a module, else ``dlb.x`` itself;
    relative imports are resolved against the importing module's package.
    """
    paths = {_module_name(p, root): p for p in root.rglob("*.py") if "_pb2" not in p.name}

    def known(name: str) -> str | None:
        while name not in paths and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in paths else None

    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        out: set[str] = set()
        for node in _run_time_nodes(_parse(path)):
            if isinstance(node, ast.Import):
                out |= {t for a in node.names if a.name.startswith("dlb.") and (t := known(a.name))}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                if base == "dlb" or base.startswith("dlb."):
                    out |= {t for a in node.names if (t := known(f"{base}.{a.name}") if f"{base}.{a.name}" in paths else known(base))}
        out.discard(mod)
        graph[mod] = out
    return graph


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Each set of modules that import one another (a strongly connected component of more than one), sorted."""
    graph = module_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


#: File methods of ``pathlib.Path`` (and of anything else: the core has no business with any of them).
_FILE_METHODS = {"read_text", "write_text", "read_bytes", "write_bytes"}


def _imported_roots(node: ast.Import | ast.ImportFrom) -> set[str]:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return {n.split(".")[0] for n in names}


def impurities(core: Path = ROOT / "core") -> list[str]:
    """Every argparse import, ``print``/``open`` call, file read/write and exit in ``core``, as ``file:line: what``."""
    bad: list[str] = []
    for path in sorted(core.rglob("*.py")):
        where = path.relative_to(core.parent.parent)
        for node in ast.walk(_parse(path)):
            what = None
            if isinstance(node, ast.Import | ast.ImportFrom) and "argparse" in _imported_roots(node):
                what = "imports argparse"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("print", "open", "exit", "quit"):
                what = f"calls {node.func.id}()"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                f = node.func
                receiver = f.value.id if isinstance(f.value, ast.Name) else None
                if f.attr in _FILE_METHODS or (f.attr == "open" and receiver not in ("self", "cls")):
                    what = f"calls .{f.attr}()"  # Path.open, io.open, os.open — a method of the core's own named open is fine
                elif f.attr == "exit" and receiver in ("sys", "os"):
                    what = f"calls {receiver}.exit()"
            elif isinstance(node, ast.Name) and node.id == "SystemExit":
                what = "uses SystemExit"
            if what:
                bad.append(f"{where}:{node.lineno}: {what}")
    return bad


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
    ("transport", "from dlb.config import Config\n"),
    ("control_plane", "from dlb.ext_proc.protocol import ExtProcServer\n"),
    ("service", "from dlb.config import Config\n"),
    ("probe", "from dlb.ext_proc.root import RootService\n"),
])
def test_a_planted_upward_import_is_caught(tmp_path: Path, package: str, planted: str) -> None:
    """The check can fail: a copy of the tree with one forbidden import reports exactly that import."""
    copy = tmp_path / "dlb"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / package / "planted.py").write_text(planted)
    found = violations(copy)
    assert len(found) == 1 and "planted.py" in found[0], found


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between modules of ``dlb/``, counting imports inside functions."""
    assert import_cycles() == []


@pytest.mark.parametrize("planted, where", [
    # a deferred import back into the module that imports this one (how the three old cycles hid)
    ("def _late():\n    from dlb.ext_proc.leaf_xds import LeafXdsSync\n    return LeafXdsSync\n", "ext_proc/leaf_setup.py"),
    # a relative import at the top: the envoy renderer's old cycle with its access-log wiring
    ("from .bootstrap import leaf_bootstrap\n", "envoy/als.py"),
])
def test_a_planted_cycle_is_caught(tmp_path: Path, planted: str, where: str) -> None:
    """The check can fail: one import added to a copy of the tree makes exactly one cycle, through that module."""
    copy = tmp_path / "dlb"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / where
    target.write_text(target.read_text() + "\n" + planted)
    found = import_cycles(copy)
    module = "dlb." + where.removesuffix(".py").replace("/", ".")
    assert len(found) == 1 and module in found[0], found


def test_an_import_only_for_type_checking_is_no_cycle(tmp_path: Path) -> None:
    """``if TYPE_CHECKING:`` imports never run, so an annotation may name a type of an importing module."""
    copy = tmp_path / "dlb"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "ext_proc" / "leaf_setup.py"
    target.write_text(target.read_text() + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                      "    from dlb.ext_proc.leaf_xds import LeafXdsSync\n")
    assert import_cycles(copy) == []


def test_the_core_does_no_io_and_parses_no_arguments() -> None:
    """``dlb/core`` is pure: no argparse, print, open, file reads/writes or exits (commands do those)."""
    assert impurities() == []


@pytest.mark.parametrize("planted", [
    "import argparse\n",
    "def f(x):\n    print(x)\n",
    "def f(p):\n    return open(p).read()\n",
    "def f(p):\n    return p.read_text()\n",
    "def f(p, s):\n    p.write_text(s)\n",
    "def f(p):\n    with p.open() as fh:\n        return fh.read()\n",
    "import sys\n\ndef f():\n    sys.exit(1)\n",
    "def f():\n    raise SystemExit('no')\n",
])
def test_a_planted_impurity_in_the_core_is_caught(tmp_path: Path, planted: str) -> None:
    """The check can fail: each forbidden thing, planted in a copy of the core, is reported once."""
    core = tmp_path / "dlb" / "core"
    shutil.copytree(ROOT / "core", core, ignore=shutil.ignore_patterns("__pycache__"))
    (core / "planted.py").write_text(planted)
    found = impurities(core)
    assert len(found) == 1 and "planted.py" in found[0], found


#: Packages whose commands live in their ``cli.py`` only (the rest move there in other parts of the work).
COMMAND_FREE = ("service", "probe", "ext_proc", "envoy", "load", "epp")
#: Where argparse belongs: the commands, and the argparse types they share (``dlb/load/argtypes.py``).
COMMAND_MODULES = {"cli.py", "argtypes.py"}


def test_library_modules_neither_parse_arguments_nor_exit() -> None:
    """In these packages only ``cli.py`` parses arguments; nothing raises SystemExit (a DlbError reaches the CLI)."""
    bad = []
    for package in COMMAND_FREE:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id == "SystemExit":
                    bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: SystemExit")
                elif (path.name not in COMMAND_MODULES and isinstance(node, ast.Import | ast.ImportFrom)
                      and "argparse" in _imported_roots(node)):
                    bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: imports argparse")
    assert bad == []



def wait_for_calls(root: Path = ROOT) -> list[str]:
    """Every ``asyncio.wait_for(...)`` call under ``root``, as ``path:line``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_service_uses_asyncio_wait_for() -> None:
    """On Python 3.11 ``asyncio.wait_for`` returns the awaited result when a cancel lands in the same turn,
    so a loop stopped by cancelling runs on: a control plane stopped just after a reload never exited.
    ``async with asyncio.timeout(...)`` passes the cancel on (tests/unit/test_flow_reload.py)."""
    assert wait_for_calls() == []


def test_a_planted_wait_for_is_caught(tmp_path: Path) -> None:
    (tmp_path / "dlb").mkdir()
    (tmp_path / "dlb" / "m.py").write_text("import asyncio\n\nasync def f(e):\n    await asyncio.wait_for(e.wait(), 1)\n")
    assert wait_for_calls(tmp_path / "dlb") == ["dlb/m.py:4"]
