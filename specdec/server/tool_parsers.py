"""Tool calls, the response side: one choice's output → content deltas and OpenAI `tool_calls`.

`detect_format` reads the chat template's family (vLLM's parser names):
  hermes       `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/3, Hermes, SmolLM3, ...)
  mistral      `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
  llama3_json  the answer is `{"name": ..., "parameters": {...}}` (calls joined by `;`, optional `<|python_tag|>`)

`ToolCallStream` (one per choice, its own state) is fed the choice's text deltas as they arrive and says what
to send: text streams as content until a call starts (a possible start of the marker is held back, never
sent twice), the call is buffered and parsed when the choice finishes. An answer that is only a JSON call
object (`{"name": a listed tool, "arguments" | "parameters": {...}}`) is a call in every family: small models
often leave the marker out (Qwen2.5-Coder-0.5B answers so). A call that does not parse, or names a
function not in `tools`, is returned as the content it was (nothing is dropped). "required" / named choices
were decoded under a JSON-schema constraint (`tools.py`): named streams its arguments as they are generated.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from specdec.server.tools import ToolPlan

__all__ = ["FORMATS", "MARKERS", "detect_format", "marker_ids", "ToolCall", "ToolCallStream"]

FORMATS = ("hermes", "mistral", "llama3_json")
MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3_json": "<|python_tag|>"}
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def detect_format(tokenizer) -> str | None:
    """The tool-call format the chat template writes (its family), or None when it names none of them."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    template = template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return None


def marker_ids(tokenizer, fmt: str | None) -> frozenset[int]:
    """The marker's token id where the vocabulary has it as one (special) token: special tokens are left out of
    the streamed text, so the stream watches for the id."""
    if fmt is None:
        return frozenset()
    ids = tokenizer.encode(MARKERS[fmt], add_special_tokens=False)
    return frozenset(ids) if len(ids) == 1 else frozenset()


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_dict(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """One choice: `feed(delta)` → the delta dicts to send now; `finish(reason)` → the last ones and the finish
    reason; then `content` and `calls` are the whole message's."""

    def __init__(self, plan: ToolPlan | None, fmt: str | None = None, marker_token_ids: frozenset[int] = frozenset()):
        self.plan, self.fmt, self.marker_token_ids = plan, fmt, marker_token_ids
        self.mode = plan.mode if plan is not None else "none"
        self.content_parts: list[str] = []  # content sent
        self.calls: list[ToolCall] = []
        self._held = ""  # content not sent yet: it may be the start of a marker
        self._buffer: str | None = None  # the call's text once one started (None: still content)
        self._named_id: str | None = None

    @property
    def content(self) -> str | None:
        text = "".join(self.content_parts)
        return None if self.calls and not text.strip() else text

    # --- feeding ------------------------------------------------------------------------------------------
    def feed(self, delta) -> list[dict]:
        """A `text.outputs.TextDelta` → delta dicts ({"content": ...} / {"tool_calls": [...]}) to send now."""
        if self.mode == "none":
            return self._content(delta.text)
        if self.mode == "named":
            return self._named(delta.text)
        if self.mode == "required" or self._buffer is not None:
            self._buffer = (self._buffer or "") + delta.text
            return []
        pieces = [(p.text, p.token_id) for p in delta.pieces]
        if not self.marker_token_ids or "".join(t for t, _ in pieces) != delta.text:
            pieces = [(delta.text, -1)]
        out = []
        for text, token_id in pieces:
            out += self._auto(text, token_id)
        return out

    def _content(self, text: str) -> list[dict]:
        if not text:
            return []
        self.content_parts.append(text)
        return [{"content": text}]

    def _named(self, text: str) -> list[dict]:
        if self._named_id is None:
            self._named_id = _call_id()
            self._buffer = text
            return [{"tool_calls": [{"index": 0, "id": self._named_id, "type": "function",
                                     "function": {"name": self.plan.name, "arguments": text}}]}]
        self._buffer += text
        return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}] if text else []

    def _auto(self, text: str, token_id: int) -> list[dict]:
        if self._buffer is not None:
            self._buffer += text
            return []
        if token_id in self.marker_token_ids:  # the marker as one token: special (no text, Mistral's) or not
            out = self._content(self._held)  # (Qwen's <tool_call>: its text is the marker)
            self._held, self._buffer = "", text if text.startswith(MARKERS[self.fmt]) else MARKERS[self.fmt] + text
            return out
        held = self._held + text
        if not self.content_parts and held.lstrip().startswith("{"):
            self._held, self._buffer = "", held  # the answer may be a bare JSON call (Llama-3's; small Qwens')
            return []
        if not held.strip() and not self.content_parts:
            self._held = held  # leading whitespace: the answer may still be a call
            return []
        marker = MARKERS.get(self.fmt, "")
        at = held.find(marker) if marker else -1
        if at >= 0:
            self._held, self._buffer = "", held[at:]
            return self._content(held[:at])
        keep = _partial_suffix(held, marker)
        self._held = held[len(held) - keep:] if keep else ""
        return self._content(held[:len(held) - keep])

    # --- the end --------------------------------------------------------------------------------------------
    def finish(self, finish_reason: str | None) -> tuple[list[dict], str | None]:
        """(the last delta dicts, the choice's finish reason: "tool_calls" when it made calls)."""
        out = []
        if self.mode == "named":
            if self._named_id is None:
                out += self._named("")
            self.calls = [ToolCall(self._named_id, self.plan.name, self._buffer or "")]
            return out, finish_reason if finish_reason in ("length", "abort") else "tool_calls"
        if self._buffer is None:
            return self._content(self._held), finish_reason
        calls = self._parse(self._buffer)
        if calls is None:  # not a call after all (or cut short): the text as it was
            out = self._content(self._held + self._buffer)
            return out, finish_reason
        self.calls = calls
        out = [{"tool_calls": [c.to_dict(i)]} for i, c in enumerate(calls)]
        return out, finish_reason if finish_reason == "abort" else "tool_calls"

    def _parse(self, text: str) -> list[ToolCall] | None:
        if self.mode == "required":
            items = _json(text)
            entries = [(e.get("name"), e.get("parameters")) for e in items if isinstance(e, dict)] \
                if isinstance(items, list) else None
        elif self.fmt == "hermes" and text.startswith(MARKERS["hermes"]):
            entries = [_entry(_json(m)) for m in _HERMES_CALL.findall(text)]
        elif self.fmt == "mistral" and text.startswith(MARKERS["mistral"]):
            items = _json(text[len(MARKERS["mistral"]):].strip())
            items = [items] if isinstance(items, dict) else items
            entries = [_entry(e) for e in items] if isinstance(items, list) else None
        else:  # Llama-3's JSON, or any family's answer that is only a JSON call (the marker left out)
            body = text.strip()
            body = body[len(MARKERS["llama3_json"]):] if body.startswith(MARKERS["llama3_json"]) else body
            entries = [_entry(_json(part)) for part in _split_calls(body)]
        names = self.plan.names
        if not entries or any(e is None or e[0] not in names or not isinstance(e[1], dict) for e in entries):
            return None
        return [ToolCall(_call_id(), name, json.dumps(args, ensure_ascii=False)) for name, args in entries]


def _json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _entry(obj) -> tuple | None:
    """(name, arguments) of one call object: {"name", "arguments"} (Hermes, Mistral) or {"name", "parameters"}."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):  # some models write the arguments as JSON text
        args = _json(args)
    return obj["name"], args


def _split_calls(body: str) -> list[str]:
    """Llama-3's calls joined by ';' — split where a JSON object ends (a ';' inside a string stays)."""
    decoder, parts, i = json.JSONDecoder(), [], 0
    while i < len(body):
        try:
            _, end = decoder.raw_decode(body, i)
        except ValueError:
            return [body]
        parts.append(body[i:end])
        i = end
        while i < len(body) and body[i] in " \n\t;":
            i += 1
    return parts


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker` (it may become one)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
