"""The eager loop over transformers models: chains, and the paper's token trees (appendix A). `specdec.decoding` (the front door) hands it what the engine does not take.

`chain`: the chain loop (`run_chain`: draft → verify in one target pass → emit → roll back, ragged rows).
`tree_decoding`: `generate(..., draft_tree=[k_1, ..., k_D])` verifies a token tree per step (`run_tree`,
`tree_generate`; the tree rules themselves are pure functions in `specdec.core.tree`).
Token trees run over `models.tree_lm.TreeCausalLM` and emit the same `StepRecord` as the chain loop. Speculative
beam search lives beside both runners, in `specdec.search`.
Import the modules directly; this package imports nothing on its own.
"""
