"""Speculative beam search (paper appendix A.4), one definition for both runners.

`beam`: `BeamSearch` (start / step / run) over any tree-pass LM — transformers' `models.tree_lm.TreeCausalLM` for
`specdec.beam_search(engine="hf")`, the engine's `engine.beam_slots.SlotTreeLM` for its beam groups — and
`beam_search`, the transformers path; `BeamRequest.of`, the one check of a call. `beam_rules`: transformers' beam
steps (`beam_step`, `BeamConfig`, `BeamState`), replayed on the target's scores. `beam_tree`: a pass's draft beams.
It sits beside the runners, not inside either: the loop (`specdec.loop`) and the engine (`specdec.engine`) never
import each other, and both import this. Import the modules directly; this package imports nothing on its own.
"""
