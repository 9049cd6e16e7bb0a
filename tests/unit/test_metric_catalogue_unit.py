"""Each service's /metrics against the one catalogue of dlb_* families (dlb/metric_catalogue.py).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_metric_catalogue.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dlb.emulator.metrics import EmulatorMetrics
from dlb.metric_catalogue import CATALOGUE, MetricDef, for_service, markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def exported(text: str) -> dict[str, tuple[str, set[str]]]:
    """dlb_* families in an exposition: name -> (type, label names seen on its samples)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("dlb_"):
            labels = {k for s in fam.samples for k in s.labels if k != "le"}
            out[fam.name] = (fam.type, labels)
    return out


def compare(service: str, text: str) -> None:
    listed = for_service(service)
    got = exported(text)
    unlisted = sorted(set(got) - set(listed))
    assert not unlisted, f"{service} exports families missing from dlb/metric_catalogue.py: {unlisted}"
    for name, (typ, labels) in got.items():
        m: MetricDef = listed[name]
        assert typ == m.type, f"{name}: exported as {typ}, catalogued as {m.type}"
        assert not labels or labels == set(m.labels), f"{name}: labels {sorted(labels)}, catalogued {list(m.labels)}"
    missing = sorted(n for n, m in listed.items() if not m.when and n not in got)
    assert not missing, f"{service} no longer exports catalogued families: {missing}"


def test_emulator_metrics_match_the_catalogue() -> None:
    """The emulator's own dlb_* family is catalogued (its vLLM-named families are vLLM's contract)."""
    compare("emulator", EmulatorMetrics(("m",)).exposition().decode())


def test_docs_table_is_the_catalogue() -> None:
    """docs/metrics.md carries the catalogue's table verbatim (regenerate it with markdown_table())."""
    assert markdown_table() in DOC.read_text(encoding="utf-8")


def test_names_are_unique_and_snake_case() -> None:
    """Each family is listed once, under dlb_<service>_, in snake_case."""
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names))
    for m in CATALOGUE:
        assert m.name.startswith(f"dlb_{m.service}_") and m.name == m.name.lower(), m.name
