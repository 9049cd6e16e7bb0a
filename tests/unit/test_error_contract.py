"""One error contract: every error DLB itself answers is OpenAI-shaped, its code is in the one table
(dlb/envoy/replies.py), and docs/operations.md lists exactly that table.

A code that some module spells on its own (a literal ``"dlb_no_…"`` outside replies.py), a code the
root or an Envoy emits that the docs do not list, or a documented code nothing emits: each fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from test_ext_proc_root import headers_msg, probe, service

from dlb.envoy import replies
from dlb.envoy.bootstrap import local_replies

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"


def documented() -> dict[str, set[tuple[int, str]]]:
    """code → {(status, type)} from the table under "What a client sees"."""
    section = DOC.read_text(encoding="utf-8").split("## What a client sees", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[tuple[int, str]]] = {}
    for m in re.finditer(r"^\| (\d{3}(?:, \d{3})*) \| `([a-z_]+)` \| `([a-z_]+)` \|", section, re.M):
        rows.setdefault(m.group(2), set()).update((int(status), m.group(3)) for status in m.group(1).split(", "))
    return rows


def root_replies() -> list[tuple[int, dict[str, str], dict]]:
    """What the root ext_proc answers: unknown path, no usable cell, every cell saturated."""
    out = []

    def reply(svc, path: str = "/v1/chat/completions") -> None:
        imm = ep.ProcessingResponse.FromString(svc.decide(headers_msg(path=path).request_headers.headers.headers)).immediate_response
        out.append((imm.status.code, {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}, json.loads(imm.body)))

    svc, clock = service()
    reply(svc, "/other")
    probe(svc, 0, clock.t)
    clock.t += 5.0  # stale
    reply(svc)
    probe(svc, 0, clock.t, rif=50, capacity=50)
    probe(svc, 1, clock.t, rif=50, capacity=50)
    reply(svc)
    return out


def test_the_docs_table_is_the_code_table() -> None:
    docs = documented()
    assert set(docs) == set(replies.ERRORS), "docs/operations.md and dlb/envoy/replies.py list different codes"
    for code, rows in docs.items():
        assert {t for _, t in rows} == {replies.ERRORS[code].type}, code


def test_every_root_reply_is_openai_shaped_and_documented() -> None:
    docs = documented()
    got = root_replies()
    assert [(status, body["error"]["code"]) for status, _, body in got] == [
        (404, replies.NO_ENDPOINT), (503, replies.NO_CAPACITY), (429, replies.NO_CAPACITY)]
    nr = [m for m in local_replies()["mappers"] if "NR" in m["filter"].get("response_flag_filter", {}).get("flags", [])]
    assert got[0][2]["error"]["message"] == nr[0]["body_format_override"]["json_format"]["error"]["message"]  # one 404 text
    for status, hdrs, body in got:
        err = body["error"]
        assert set(body) == {"error"} and set(err) == {"message", "type", "param", "code"}
        assert hdrs["content-type"] == "application/json" and err["message"].startswith("dlb: ")
        assert (status, err["type"]) in docs[err["code"]]
        assert ("retry-after" in hdrs) == replies.ERRORS[err["code"]].retry


def test_every_envoy_failure_reply_carries_a_documented_code() -> None:
    docs = documented()
    mapped = set()
    for m in local_replies()["mappers"]:
        err = m["body_format_override"]["json_format"]["error"]
        assert err["code"] in docs and err["type"] == replies.ERRORS[err["code"]].type
        assert ("headers_to_add" in m) == replies.ERRORS[err["code"]].retry
        if "response_flag_filter" in m["filter"]:
            mapped |= set(m["filter"]["response_flag_filter"]["flags"])
        else:
            expression = m["filter"]["extension_filter"]["typed_config"]["expression"]
            reply = {r.expression: r for r in replies.ENVOY_REPLIES}[expression]
            assert err["code"] == reply.code and m.get("status_code") == reply.status
            assert {(status, err["type"]) for status in reply.statuses} <= docs[err["code"]]
            mapped.add(expression)
    assert mapped == set(replies.ENVOY_FLAGS) | {r.expression for r in replies.ENVOY_REPLIES}


def test_no_module_spells_a_code_of_its_own() -> None:
    """Codes are named through replies.py, so the table above is every code there is."""
    literal = re.compile(r"""["']dlb_(?:no|upstream|request|bad)_[a-z_]+["']""")
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in sorted((REPO / "dlb").rglob("*.py"))
             if p.name != "replies.py" for m in literal.finditer(p.read_text(encoding="utf-8"))]
    assert not found, found
