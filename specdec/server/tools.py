"""Tool calls, the request side: `tools` and `tool_choice` checked into one frozen `ToolPlan`.

  tool_choice "none"      the tools are rendered into the prompt (the chat template's `tools`), the answer is
                          plain text: nothing is parsed
  "auto" (the default     the model decides; its output is parsed in the template family's format
  with tools)             (`tool_parsers.py`: Hermes `<tool_call>`, Llama-3 JSON, Mistral `[TOOL_CALLS]`)
  "required"              the output is constrained (`specdec.constrain`, exact under speculation) to a JSON
                          array of calls `[{"name": ..., "parameters": {...}}]` over the listed functions
                          (one call at most with `parallel_tool_calls: false`) — vLLM's shape
  {"type": "function",    the output is constrained to that function's `parameters` schema: the text is the
   "function": {"name"}}  call's arguments

Everything is checked before tokenization; a schema keyword the grammar engine would not enforce is a 400 naming
the tool and where it is (`constrain.check_schema`). Messages that carry earlier calls (`assistant.tool_calls`,
role `tool`) go to the template as transformers' chat templates expect them (arguments as objects).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specdec.constrain import Constraint, check_schema
from specdec.server.protocol import APIError

__all__ = ["ToolPlan", "plan_tools", "template_tool_calls", "MAX_TOOLS", "CHOICES"]

MAX_TOOLS = 128
CHOICES = ("none", "auto", "required")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's tools ask of the server. `tools`: the request's list as the template receives it;
    `mode`: none | auto | required | named; `name`: the named function; `constraint`: required's / named's."""

    tools: tuple[dict, ...]
    mode: str
    name: str | None = None
    constraint: Constraint | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)


def plan_tools(request) -> ToolPlan | None:
    """The request's `ToolPlan`, or None (no tools and no tool_choice); APIError naming the field otherwise."""
    tools, choice = request.tools, request.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise APIError(f"tool_choice={json.dumps(choice)[:60]} needs tools", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise APIError(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}", param="tools")
    checked = tuple(_check_tool(t, i) for i, t in enumerate(tools))
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise APIError(f"tools: the function name {twice!r} is listed twice", param="tools")
    mode, name = _mode(choice, names)
    if mode in ("none", "auto"):
        return ToolPlan(checked, mode)
    schemas = {t["function"]["name"]: t["function"].get("parameters", _EMPTY_PARAMETERS) for t in checked}
    if mode == "named":
        schema = schemas[name]
    else:
        calls = [{"type": "object", "properties": {"name": {"const": n}, "parameters": s},
                  "required": ["name", "parameters"]} for n, s in schemas.items()]
        schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if request.parallel_tool_calls is False:
            schema["maxItems"] = 1
    try:
        constraint = Constraint.json_schema(schema)
    except (TypeError, ValueError) as err:
        raise APIError(f"tools: {err}", param="tools") from None
    return ToolPlan(checked, mode, name, constraint)


def _mode(choice, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise APIError(f"tool_choice must be one of {', '.join(CHOICES)} or a named function, got {choice!r:.40}",
                           param="tool_choice")
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(function, dict)
            and isinstance(function.get("name"), str) and set(choice) == {"type", "function"}
            and set(function) == {"name"}):
        raise APIError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                       '{"name": ...}}', param="tool_choice")
    if function["name"] not in names:
        raise APIError(f"tool_choice names the function {function['name']!r:.60}, which is not in tools "
                       f"({', '.join(names)[:200]})", param="tool_choice")
    return "named", function["name"]


def _check_tool(tool, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise APIError(f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}',
                       param="tools")
    if set(tool) != {"type", "function"}:
        raise APIError(f"{where}.{sorted(set(tool) - {'type', 'function'})[0]} is not a field of a tool", param="tools")
    function = tool["function"]
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise APIError(f"{where}.function.{unknown[0]} is not a field of a function", param="tools")
    name = function.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or \
            not all(c.isascii() and (c.isalnum() or c in "_-") for c in name):
        raise APIError(f"{where}.function.name must be 1-64 letters, digits, _ or - (got {json.dumps(name)[:60]})",
                       param="tools")
    if not isinstance(function.get("description", ""), str):
        raise APIError(f"{where}.function.description must be a string", param="tools")
    if function.get("strict") not in (None, True, False):
        raise APIError(f"{where}.function.strict must be true or false", param="tools")
    parameters = function.get("parameters", _EMPTY_PARAMETERS)
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise APIError(f"{where}.function.parameters must be a JSON schema of type object", param="tools")
    try:
        check_schema(parameters, f"{where}.function.parameters")
    except ValueError as err:
        raise APIError(str(err), param="tools") from None
    return tool


def template_tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's `tool_calls` (OpenAI's shape, arguments a JSON string) as chat templates read
    them: {"type": "function", "id", "function": {"name", "arguments": an object}} (as vLLM passes them)."""
    out = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments"), str) or call.get("type", "function") != "function":
            raise APIError(f'{where} must be {{"id": ..., "type": "function", "function": {{"name": ..., '
                           f'"arguments": "<JSON text>"}}}}', param="messages")
        try:
            arguments = json.loads(function["arguments"])
        except (ValueError, RecursionError):
            raise APIError(f"{where}.function.arguments is not JSON text", param="messages") from None
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out
