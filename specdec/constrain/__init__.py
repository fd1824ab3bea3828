"""Constrained decoding under speculation: JSON schema / JSON object / regex / choice / EBNF.

Terms:
  Constraint   what the request asks for, tokenizer-free and checked (`spec.py`)
  Grammar      a constraint compiled for one tokenizer and logits width V (`grammar.py`, xgrammar)
  mask_i       the tokens allowed at draft position i given the committed text and the drafts x_<i
  p̃, q̃         p and q with the forbidden tokens' scores set to -inf before temperature and the filters

The output law is plain decoding's from p̃: the mask is applied to p at every verified position and to q at
every drafted position, the grammar state advanced along the draft and rolled back to what was committed
(`state.GrammarState`, one per row: the `core.processors.TokenConstraint` the runners drive; a compiled
`Grammar` is the `ConstraintSpec` a request carries as `SamplingParams(constraint=...)`).
"""

from specdec.constrain.grammar import MISSING_ENGINE, Grammar, compile_constraint, grammar_engine_available
from specdec.constrain.spec import Constraint, check_schema
from specdec.constrain.state import GrammarState, unpack_bitmask

__all__ = ["Constraint", "Grammar", "GrammarState", "compile_constraint", "check_schema", "grammar_engine_available",
           "unpack_bitmask", "MISSING_ENGINE"]
