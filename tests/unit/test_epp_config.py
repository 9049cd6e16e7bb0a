"""A cell served by ``dlb serve epp`` from a Kubernetes InferencePool: ``inference_pool`` instead of ``servers``.

Rules: a dlb cell needs ``servers`` or ``inference_pool`` (not both, and the error names file and field);
``inference_pool`` is a Kubernetes name, an optional namespace and one of GIE's two API groups; the EPP's
``--pool-*`` flags override it field by field.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from dlb.config import ConfigError, parse_config
from dlb.config.model import InferencePoolRef
from dlb.epp.cli import pool_ref
from dlb.epp.k8s import PoolRef
from dlb.errors import UsageError

LEAF = "leaf: {address: 'gw.llm.svc:80', probe: 'dlb-epp.llm.svc:9002'}"


def config(cell: str) -> str:
    return f"version: 1\ncells:\n  - name: pool\n    {LEAF}\n    {cell}\nendpoints: [{{name: chat, match: {{prefix: /v1/}}}}]\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "dlb.yaml")
    return [str(p) for p in err.value.problems]


def test_a_cell_whose_servers_are_an_inference_pool_lists_none() -> None:
    cell = parse_config(config("inference_pool: {name: vllm-llama3-8b-instruct, namespace: llm}"), "dlb.yaml").cell("pool")
    assert cell.servers == () and cell.replicas == 1
    assert cell.inference_pool == InferencePoolRef("vllm-llama3-8b-instruct", "llm", "inference.networking.k8s.io")


@pytest.mark.parametrize(("cell", "field", "reason"), [
    ("replicas: 1", "cells[0].servers", "required (or inference_pool: the Kubernetes InferencePool"),
    ("servers: ['10.0.0.1:8000']\n    inference_pool: {name: p}", "cells[0].inference_pool", "set servers or inference_pool, not both"),
    ("inference_pool: {name: Pool_1}", "cells[0].inference_pool.name", "is not a Kubernetes object name"),
    ("inference_pool: {name: p, namespace: a.b}", "cells[0].inference_pool.namespace", "is not a Kubernetes namespace"),
    ("inference_pool: {name: p, group: inference.networking.k8s.io/v1}", "cells[0].inference_pool.group", "is not one of"),
    ("inference_pool: {namespace: llm}", "cells[0].inference_pool.name", "required"),
    ("inference_pool: {name: p, selector: {app: x}}", "cells[0].inference_pool.selector", "unknown key"),
])
def test_a_cell_without_servers_or_a_usable_pool_is_refused_naming_file_and_field(cell: str, field: str, reason: str) -> None:
    found = problems(config(cell))
    assert any(p.startswith("dlb.yaml:") and f" {field}: " in p and reason in p for p in found), found


def test_only_a_dlb_cell_can_follow_an_inference_pool() -> None:
    text = config("inference_pool: {name: p}").replace("leaf: {", "leaf: {source: gie, ")
    assert any("cells[0].inference_pool: a gie cell's servers are not DLB's to pick" in p for p in problems(text))


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"pool_name": None, "pool_namespace": None, "pool_group": None, **kw})


def test_the_pool_flags_override_the_cells_inference_pool() -> None:
    cell = parse_config(config("inference_pool: {name: p, namespace: llm, group: inference.networking.x-k8s.io}"), "f").cell("pool")
    assert pool_ref(args(), cell, "f") == PoolRef("p", "llm", "inference.networking.x-k8s.io")
    assert pool_ref(args(pool_name="q", pool_group="inference.networking.k8s.io"), cell, "f") == PoolRef("q", "llm", "inference.networking.k8s.io")
    listed = parse_config(config("servers: ['10.0.0.1:8000']"), "f").cell("pool")
    assert pool_ref(args(), listed, "f") is None  # the cell's own servers
    assert pool_ref(args(pool_name="q", pool_namespace="ns"), listed, "f") == PoolRef("q", "ns", "inference.networking.k8s.io")
    with pytest.raises(UsageError, match="--pool-namespace and --pool-group need --pool-name"):
        pool_ref(args(pool_namespace="ns"), listed, "f")
    with pytest.raises(UsageError, match="--pool-group must be one of"):
        pool_ref(args(pool_name="q", pool_group="x"), listed, "f")


def test_a_leaf_refuses_a_cell_whose_servers_are_an_inference_pool(tmp_path: Path) -> None:
    from dlb.cli import build_parser

    (tmp_path / "dlb.yaml").write_text(config("inference_pool: {name: p}"))
    args = build_parser(None).parse_args(["serve", "leaf", "--config", str(tmp_path / "dlb.yaml"), "--cell", "pool"])
    with pytest.raises(UsageError, match=r"cells\[0\]\.inference_pool: the servers are an InferencePool's pods, which dlb serve epp"):
        args.func(args)


@pytest.mark.parametrize("source", ["vllm", "gie"])
def test_a_leaf_refuses_a_foreign_cell(tmp_path: Path, source: str) -> None:
    from dlb.cli import build_parser

    (tmp_path / "dlb.yaml").write_text(config("servers: ['10.0.0.1:8000']").replace("leaf: {", f"leaf: {{source: {source}, "))
    args = build_parser(None).parse_args(["serve", "leaf", "--config", str(tmp_path / "dlb.yaml"), "--cell", "pool"])
    with pytest.raises(UsageError, match=rf"cells\[0\]\.leaf\.source is '{source}': cell 'pool' runs no DLB leaf"):
        args.func(args)


@pytest.mark.parametrize(("source", "cell"), [("vllm", "servers: ['10.0.0.1:8000']"), ("gie", "replicas: 1")])
def test_an_epp_refuses_a_foreign_cell(tmp_path: Path, source: str, cell: str) -> None:
    """A gie cell has no servers of DLB's (its EPP died in a traceback: a leaf needs at least one server);
    a vllm cell's servers are scraped by the roots, which never read this EPP's probe answers."""
    from dlb.cli import build_parser

    (tmp_path / "dlb.yaml").write_text(config(cell).replace("leaf: {", f"leaf: {{source: {source}, "))
    args = build_parser(None).parse_args(["serve", "epp", "--config", str(tmp_path / "dlb.yaml"), "--cell", "pool"])
    with pytest.raises(UsageError, match=rf"dlb serve epp: .*cells\[0\]\.leaf\.source is '{source}': the roots read"):
        args.func(args)
