"""The eager transformers loop's extensions (paper appendix A): token trees and speculative beam search.

`tree_decoding`: `generate(..., draft_tree=[k_1, ..., k_D])` verifies a token tree per step (`run_tree`,
`tree_generate`; the tree rules themselves are pure functions in `specdec.core.tree`).
`beam`: `specdec.beam_search` (drafter beams → one target tree pass → transformers' beam steps replayed,
`beam_rules`). Both run over `models.tree_lm.TreeCausalLM` and emit the same `StepRecord` as the chain loop
(`specdec.decoding`). Import the modules directly; this package imports nothing on its own.
"""
