"""`specdec serve`: an OpenAI-compatible HTTP server over `specdec.text.LLM` (FastAPI + uvicorn).

  protocol.py   OpenAI request bodies → checked parameters (4xx with OpenAI's error body); response bodies
  metrics.py    Prometheus metrics (vLLM's spec-decode names under `specdec:`), one registry per app
  app.py        the routes; model steps stay on the LLM's driver thread, never on the event loop
  static/       the playground page served at `/`
"""

from specdec.server.app import create_app

__all__ = ["create_app"]
