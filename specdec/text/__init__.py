"""Text in, text out: `specdec.load(...)` and the layers under it (an outer ring over the engine and the loop).

  prompts.py     strings / ids / chat messages → token ids; kwargs + generation_config → SamplingParams
  runner.py      the runner interface (add_request / abort / step) and `FallbackRunner` over `specdec.stream`
  driver.py      one background thread stepping the runners; outputs handed to per-request sinks
  detokenize.py  incremental detokenization (`DecodeStream`) and stop strings
  outputs.py     runner outputs → text deltas, `Completion`, per-request stats
  api.py         `load()` and the `LLM` object: `generate`, `stream`
"""

from specdec.text.api import LLM, TextStream, load
from specdec.text.outputs import Completion, RequestStats, TextDelta, TokenPiece

__all__ = ["load", "LLM", "TextStream", "Completion", "RequestStats", "TextDelta", "TokenPiece"]
