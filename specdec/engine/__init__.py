"""The request-level engine: continuous batching, a static slot cache, graphs captured once per shape.

    from specdec.engine import Engine, EngineConfig
    engine = Engine(target, drafter, EngineConfig(max_batch_size=64))

Terms:
  slot      a row of the preallocated caches and state; a running request owns one (slots 0..n-1)
  bucket    the batch sizes steps run at (1, 2, 4, ..., padded with idle slots), and the cache lengths
            a step attends over (powers of two), so a few captured graphs serve every request mix
  flavor    what the rows of a step need: all greedy? any top-k / top-p? logprobs?
`specdec.generate(..., engine="fast")` runs its prompts through an `Engine` (see `engine_generate`).
"""

from specdec.engine.config import EngineConfig, UnsupportedModel
from specdec.engine.engine import Engine, RequestOutput

__all__ = ["Engine", "EngineConfig", "RequestOutput", "UnsupportedModel"]
