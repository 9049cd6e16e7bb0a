"""OpenAI-compatible wire format for the emulator: request validation and response bodies (pure).

Only what decides *load* is read from a request: how many prompt tokens it carries (estimated from
text length, ~4 characters per token, as no tokenizer is loaded), how many tokens it will generate
(``max_tokens`` or a seeded sample) and whether it streams. Everything else in the body is accepted
and ignored, as a real server would ignore sampling parameters that do not change the cost.
Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, and name the field.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from dlb.errors import DlbError

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4  # role/turn markers a chat template adds (Llama-3 uses ~4-5)

# Every generated token is one of these 4-character strings, so re-estimating the generated text
# with CHARS_PER_TOKEN gives back exactly the completion token count.
_VOCAB = (" the", " and", " for", " you", " are", " not", " but", " can",
          " was", " all", " one", " has", " new", " out", " use", " may")  # fmt: skip

Kind = Literal["completion", "chat"]


class ApiError(DlbError):
    """An error the server answers with an OpenAI-style JSON body."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    prefix: str | tuple[int, ...] = ""  # canonical prompt content, for prefix caching


def estimate_tokens(text: str) -> int:
    """Prompt tokens for a text without a tokenizer: ceil(chars / 4), at least 1 for non-empty text."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def token_text(rid: int, index: int) -> str:
    """Deterministic text of generated token ``index`` of request ``rid``."""
    return _VOCAB[(rid * 7 + index) % len(_VOCAB)]


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, param=param)


def _int_field(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _bad(f"'{name}' must be an integer >= 1, got {v!r}", name)
    return v


def _prompt_content(kind: Kind, body: dict[str, Any]) -> str | tuple[int, ...]:
    """The prompt as the cache sees it: text (chat: role-tagged turns) or token ids."""
    if kind == "completion":
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else tuple(prompt)
    parts = []
    for m in body["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p["text"] for p in content if isinstance(p.get("text"), str))
        parts.append(f"<|{m['role']}|>{content or ''}")
    return "".join(parts)


def _prompt_tokens_completion(prompt: Any) -> int:
    # OpenAI accepts a string, a token list, or a one-element batch of either; batches of several
    # prompts are a real API feature the emulator does not model (one engine request per HTTP request).
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return estimate_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        raise _bad("'prompt': batched prompts are not supported by the emulator; send one prompt per request", "prompt")
    raise _bad(f"'prompt' must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")


def _prompt_tokens_chat(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    chars = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
        content = m.get("content")
        if content is None or isinstance(content, str):
            chars += len(content or "")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise _bad(f"'messages[{i}].content[{j}]' must be an object", f"messages[{i}].content[{j}]")
                if isinstance(part.get("text"), str):
                    chars += len(part["text"])
        else:
            raise _bad(f"'messages[{i}].content' must be a string or a list of parts", f"messages[{i}].content")
    return math.ceil(chars / CHARS_PER_TOKEN) + CHAT_TOKENS_PER_MESSAGE * len(messages)


def load_json(raw: bytes) -> Any:
    """A request body as JSON, or a 400 :class:`ApiError` for anything that is not.

    Beyond syntax errors, ``json.loads`` raises ``ValueError`` for an integer of more than 4,300 digits
    and ``RecursionError`` for arrays nested ~100,000 deep; both used to escape as aiohttp's text/plain
    500 (issue 14 row 11).
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise _bad("request body is not valid JSON: nested too deeply", None) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError and the int-digits limit are all ValueErrors
        raise _bad(f"request body is not valid JSON: {str(e)[:200]}", None) from None


def parse_request(kind: Kind, raw: bytes, models: tuple[str, ...], max_model_len: int) -> ParsedRequest:
    """Validate a request body; raises :class:`ApiError` naming the offending field."""
    body = load_json(raw)
    if not isinstance(body, dict):
        raise _bad(f"request body must be a JSON object, got {type(body).__name__}", None)
    model = body.get("model")
    if model is None:
        model = models[0]  # like vLLM: the model field may be omitted when one model is served
    elif not isinstance(model, str):
        raise _bad(f"'model' must be a string, got {type(model).__name__}", "model")
    elif model not in models:
        raise ApiError(404, f"The model `{model}` does not exist.", type_="NotFoundError", param="model",
                       code="model_not_found")  # fmt: skip
    if kind == "completion":
        if "prompt" not in body:
            raise _bad("'prompt' is a required property", "prompt")
        prompt_tokens = _prompt_tokens_completion(body["prompt"])
        max_tokens = _int_field(body, "max_tokens")
    else:
        if "messages" not in body:
            raise _bad("'messages' is a required property", "messages")
        prompt_tokens = _prompt_tokens_chat(body["messages"])
        max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
    prompt_tokens = max(1, prompt_tokens)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise _bad(f"'n': the emulator generates one choice per request, got n={n!r}", "n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad(f"'stream' must be a boolean, got {stream!r}", "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise _bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
        if not isinstance(opts, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        include_usage = bool(opts.get("include_usage", False))
    if prompt_tokens >= max_model_len or (max_tokens is not None and prompt_tokens + max_tokens > max_model_len):
        raise _bad(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the prompt, {max_tokens or 0} in the "
            "completion). Please reduce the length of the prompt or completion.",
            "max_tokens" if max_tokens is not None else ("prompt" if kind == "completion" else "messages"),
        )
    return ParsedRequest(kind, model, prompt_tokens, max_tokens, stream, include_usage, _prompt_content(kind, body))


@dataclass
class OutputSampler:
    """Decides how many tokens a request generates.

    ``mode="max_tokens"``: exactly ``max_tokens`` when given (``finish_reason`` "length"), a sample
    otherwise. ``mode="sample"``: always a sample, capped by ``max_tokens``, so requests end early
    ("stop") like real generations that hit end-of-sequence. Samples are Gamma(shape 2) with the given
    mean, from a seeded RNG, so a run is reproducible.
    """

    mean: float = 128.0
    mode: Literal["max_tokens", "sample"] = "max_tokens"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mean < 1:
            raise ValueError(f"output mean must be >= 1, got {self.mean}")
        if self.mode not in ("max_tokens", "sample"):
            raise ValueError(f"output mode must be 'max_tokens' or 'sample', got {self.mode!r}")
        self._rng = random.Random(self.seed)

    def output_tokens(self, req: ParsedRequest, max_model_len: int) -> tuple[int, str]:
        """(tokens to generate, finish_reason)."""
        room = max(1, max_model_len - req.prompt_tokens)
        if req.max_tokens is not None and self.mode == "max_tokens":
            return min(req.max_tokens, room), "length"
        cap = min(req.max_tokens, room) if req.max_tokens is not None else room
        n = max(1, round(self._rng.gammavariate(2.0, self.mean / 2.0)))
        if n >= cap:
            return cap, "length"
        return n, "stop"


# -- response bodies ------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` only when prefix caching is on."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def full_response(kind: Kind, rid: str, created: int, model: str, text: str, finish_reason: str,
                  prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:  # fmt: skip
    if kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}  # fmt: skip
        obj = "chat.completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}  # fmt: skip


def chunk(kind: Kind, rid: str, created: int, model: str, text: str | None, finish_reason: str | None,
          include_usage: bool, *, role: bool = False) -> dict[str, Any]:  # fmt: skip
    """One streamed chunk. With ``include_usage`` every chunk carries ``"usage": null`` (OpenAI's rule)."""
    if kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if include_usage:
        out["usage"] = None
    return out


def usage_chunk(kind: Kind, rid: str, created: int, model: str, prompt_tokens: int,
                completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The final chunk sent when ``stream_options.include_usage``: no choices, only usage."""
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}  # fmt: skip


class ChunkEncoder:
    """Encodes one stream's token chunks as SSE bytes, byte-identical to ``sse(chunk(...))``.

    Streaming costs one chunk per token per step, the emulator's main CPU cost under load; the
    middle-of-stream chunk differs only in its text, so it is a pre-built template (~10x cheaper than
    building and serialising the dict each time). First and last chunks take the general path.
    """

    def __init__(self, kind: Kind, rid: str, created: int, model: str, include_usage: bool) -> None:
        self._args = (kind, rid, created, model)
        self._include_usage = include_usage
        marker = "\x00TOKEN\x00"
        template = sse(chunk(kind, rid, created, model, marker, None, include_usage))
        self._head, self._tail = template.split(json.dumps(marker).encode())

    def token(self, text: str, finish_reason: str | None, *, role: bool = False) -> bytes:
        if finish_reason is None and not role:
            return self._head + json.dumps(text).encode() + self._tail
        return sse(chunk(*self._args, text, finish_reason, self._include_usage, role=role))


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event carrying ``data``."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")
