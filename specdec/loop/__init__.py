"""The eager loop over transformers models: chains, and the paper's extensions (appendix A) token trees and
speculative beam search. `specdec.decoding` (the front door) hands it what the engine does not take.

`chain`: the chain loop (`run_chain`: draft → verify in one target pass → emit → roll back, ragged rows).
`tree_decoding`: `generate(..., draft_tree=[k_1, ..., k_D])` verifies a token tree per step (`run_tree`,
`tree_generate`; the tree rules themselves are pure functions in `specdec.core.tree`).
`beam`: `specdec.beam_search` (drafter beams → one target tree pass → transformers' beam steps replayed,
`beam_rules`). Both run over `models.tree_lm.TreeCausalLM` and emit the same `StepRecord` as the chain loop.
Import the modules directly; this package imports nothing on its own.
"""
