"""Malformed request bodies get the emulator's JSON 400, never aiohttp's text/plain 500 (issue 14 row 11).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_emulator_hostile.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlb.emulator.openai import ApiError, parse_request

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["prompt", "messages", "role", "content", "text", "model", "max_tokens", "max_completion_tokens",
         "n", "stream", "stream_options", "include_usage", "x"]), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(st.sampled_from(["prompt", "messages", "model", "max_tokens", "max_completion_tokens", "n",
                                             "stream", "stream_options"]), _json, max_size=6),
       chat=st.booleans())
def test_any_json_body_parses_or_raises_an_api_error(body: dict[str, Any], chat: bool) -> None:
    raw = json.dumps(body).encode()
    try:
        parsed = parse_request("chat" if chat else "completion", raw, ("dlb-emulated",), 4096)
    except ApiError as e:
        assert 400 <= e.status < 500 and e.body()["error"]["message"]
    else:
        assert parsed.prompt_tokens >= 1
