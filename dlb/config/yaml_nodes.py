"""YAML text -> plain data, remembering the line of every field path and catching duplicate keys.

Why not ``yaml.safe_load``: it forgets where a value came from and silently keeps the last of two
equal keys; a config problem must name its file:line, and a duplicate key is a problem. Budgets bound
what a hostile file can cost before any value is built.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from dlb.config.problems import Problem


def join(path: str, key: str) -> str:
    """The field path of ``key`` under ``path`` (``cells[1]`` + ``leaf`` -> ``cells[1].leaf``)."""
    return f"{path}.{key}" if path else key


#: Budgets that bound what a hostile or broken file can cost (issue 14 rows 7-8: an alias bomb took 60 s and 1.67 GB,
#: 5,000-deep nesting a Python traceback). A real DLB config is a few KB, nested about 6 deep, with a few hundred values;
#: the budgets sit far above that and keep the worst file within ~0.5 s and ~60 MB (docs/security.md).
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 64
#: Values (scalars, mappings, lists) after alias expansion: every alias counts the whole subtree it stands for, each
#: time it is used. 20,000 is ~5x a 64-cell config with a full latency matrix; composing that many takes ~0.5 s.
MAX_VALUES = 20_000
#: libyaml when PyYAML was built with it (~30x faster: a 1 MB file of scalars took 39 s in pure Python).
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MERGE_TAG = "tag:yaml.org,2002:merge"


class _OverBudget(Exception):
    def __init__(self, path: str, line: int, reason: str = "") -> None:
        super().__init__(path)
        self.path, self.line = path, line
        self.reason = reason or f"more than {MAX_VALUES:,} values once aliases are expanded (an alias bomb?)"


def _scan(text: str, source: str) -> Problem | None:
    """Depth and size from the event stream, before composing (the parser is iterative, the composer recursive)."""
    depth = values = 0
    for ev in yaml.parse(text, Loader=_LOADER):
        if isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            values += 1
            if values > MAX_VALUES:
                return Problem(source, "", f"more than {MAX_VALUES:,} values (a DLB config has hundreds)", ev.start_mark.line + 1)
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                return Problem(source, "", f"nested deeper than {MAX_DEPTH} levels (a DLB config needs fewer than 10)", ev.start_mark.line + 1)
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


STR_TAG = "tag:yaml.org,2002:str"
#: A YAML 1.2 (and JSON) float with an exponent, which YAML 1.1 reads as a string unless it has both a
#: dot and a signed exponent.
_YAML12_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z")


def compose(text: str, source: str) -> tuple[Any, dict[str, int], list[Problem]]:
    problems: list[Problem] = []
    marks: dict[str, int] = {}
    if len(text) > MAX_CONFIG_BYTES:
        problems.append(Problem(source, "", f"{len(text):,} characters: larger than the {MAX_CONFIG_BYTES:,} a config may have"))
        return None, marks, problems
    try:
        deep = _scan(text, source)
        if deep is not None:
            return None, marks, [deep]
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = f"not valid YAML: {getattr(exc, 'problem', None) or exc}"
        problems.append(Problem(source, "", reason, mark.line + 1 if mark else None))
        return None, marks, problems
    constructor = yaml.SafeLoader("")
    budget = [MAX_VALUES]

    def scalar(node: yaml.Node, path: str, line: int | None = None) -> Any:
        if (node.tag == STR_TAG and not node.style and _YAML12_FLOAT.match(node.value)  # (plain: None, or "" from libyaml)
                and not text.startswith("!", node.start_mark.index)):  # (not an explicit !!str)
            # PyYAML resolves YAML 1.1, where a float needs a dot ('4e-05' is a string); JSON and
            # YAML 1.2 write exponents without one (json.dumps(0.00004) == '4e-05'): a plain scalar
            # of that shape is a number, a quoted one stays a string.
            return float(node.value)
        try:
            return constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # ValueError: an int of > 4,300 digits
            problems.append(Problem(source, path, f"bad value: {str(exc)[:200]}", line or node.start_mark.line + 1))
            return None

    def merge_sources(vnode: yaml.Node, path: str) -> list[yaml.MappingNode]:
        items = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        if all(isinstance(n, yaml.MappingNode) for n in items):
            return items
        problems.append(Problem(source, join(path, "<<"), "a merge key '<<' takes a mapping or a list of mappings", vnode.start_mark.line + 1))
        return []

    #: ids of the nodes converted so far: meeting one again means an alias (``*name``) of it is being used.
    seen: set[int] = set()
    #: The nodes being converted now (this node's ancestors): an alias of one of them is a cycle (``x: &a [*a]``),
    #: which would recurse until Python's stack ran out (a reload under ``dlb up`` then stopped everything).
    open_nodes: set[int] = set()

    def conv(node: yaml.Node, path: str, use_line: int | None = None, alias_line: int | None = None, depth: int = 0) -> Any:
        """``use_line``: where the parent names this node (its key's line); ``alias_line``: inside an alias,
        the line of the alias's use, where every field of it is reported (the composed alias is the
        anchor's node itself, so its own marks point at the anchor: cells[1] given as ``*leaf`` was
        reported on cells[0]'s line)."""
        if alias_line is None and id(node) in seen:
            alias_line = use_line
        seen.add(id(node))
        line = alias_line or node.start_mark.line + 1
        if id(node) in open_nodes:
            raise _OverBudget(path, line, "an alias refers to a mapping or list that contains it (a cycle)")
        if depth > MAX_DEPTH:  # aliases nest deeper than the text (a chain of anchors each wrapping the last)
            raise _OverBudget(path, line, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
        budget[0] -= 1
        if budget[0] < 0:
            raise _OverBudget(path, line)
        marks.setdefault(path, line)
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return scalar(node, path, line)
        open_nodes.add(id(node))
        try:
            return collection(node, path, line, alias_line, depth + 1)
        finally:
            open_nodes.discard(id(node))

    def collection(node: yaml.Node, path: str, line: int, alias_line: int | None, depth: int) -> Any:
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            merges: list[tuple[yaml.MappingNode, int]] = []
            for knode, vnode in node.value:
                kline = alias_line or knode.start_mark.line + 1
                if not isinstance(knode, yaml.ScalarNode):
                    problems.append(Problem(source, path, "mapping keys must be plain scalars", kline))
                    continue
                if knode.tag == MERGE_TAG:  # YAML merge key: explicit keys win, then earlier merged mappings
                    merges += [(m, kline) for m in merge_sources(vnode, path)]
                    continue
                key = str(scalar(knode, path, kline))
                child = join(path, key)
                if key in out:
                    problems.append(Problem(source, child, f"duplicate key (first given on line {marks.get(child)})", kline))
                    continue
                out[key] = conv(vnode, child, kline, alias_line, depth)
            for merged, kline in merges:
                for key, value in conv(merged, path, kline, alias_line, depth).items():
                    out.setdefault(key, value)
            return out
        return [conv(item, f"{path}[{i}]", line, alias_line, depth) for i, item in enumerate(node.value)]

    try:
        data = conv(root, "") if root is not None else None
    except _OverBudget as over:
        return None, marks, [Problem(source, over.path, over.reason, over.line)]
    return data, marks, problems
