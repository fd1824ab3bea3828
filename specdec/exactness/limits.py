"""Bounds and defaults of `specdec.check` (no torch: the CLI builds its parser from these)."""

DEFAULT_TRIALS = 2000
MAX_TRIALS = 1_000_000
DEFAULT_POSITIONS = 3
MAX_POSITIONS = 6
MAX_PROMPTS = 64
MAX_PROMPT_TOKENS = 4096
MAX_GREEDY_TOKENS = 4096
ENGINES = ("auto", "fast", "hf")
