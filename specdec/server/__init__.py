"""`specdec serve`: an OpenAI-compatible HTTP server over `specdec.text.LLM` (FastAPI + uvicorn).

  schema.py     the request bodies as strict pydantic models: every OpenAI / vLLM field, and which are refused
  protocol.py   body → typed, checked request → tokenized prompts (4xx with OpenAI's error body, naming the field)
  choices.py    checked request → runner requests: fields → specdec.text parameters, EOS ids, n choices and seeds
  responses.py  results → OpenAI response bodies (usage, logprobs, `specdec` and `speculative_decoding` objects)
  bodies.py     a finished run → the completions / chat body, or its SSE stream
  tools.py      `tools` / `tool_choice` → a `ToolPlan` (required / named: a JSON-schema constraint)
  tool_parsers.py  one choice's output → content and OpenAI `tool_calls` (Hermes, Mistral, Llama-3 JSON)
  responses_api.py  a minimal /v1/responses over the chat path
  utility.py    /version, /tokenize, /detokenize; the request schemas /openapi.json shows
  guard.py      Host / Origin (DNS rebinding, cross-site), API key, JSON content type: before any route runs
  http.py       uvicorn's h11 protocol plus a read deadline and a connection limit
  runs.py       one HTTP request's runner requests; driver thread → event loop hand-off (one wake-up per step)
  metrics.py    Prometheus metrics (vLLM's names and `model_name` label under a prefix), one registry per app
  app.py        the routes; tokenization on worker threads, model steps on the LLM's driver thread
  static/       the playground page served at `/`
"""

from specdec.server.app import create_app

__all__ = ["create_app"]
