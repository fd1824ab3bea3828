"""The benchmark harness behind `specdec bench`: ours vs transformers, side by side, same prompts.

Terms: a *configuration* is (method, drafter kind, temperature, batch size, γ); a *row* is its measurement
(tokens/s, α, τ, c, Thm 3.8 prediction from that run's α, c, γ, measured speedup over the matching plain
row, MBU of plain decoding, peak extra GPU memory). Methods: `ours-engine` (the request-level
engine `specdec.engine`, one host sync per step), `ours-loop` (`specdec.generate` with a `FastTarget`), `hf` (transformers `generate`).

Modules: `presets` (smoke / gpu / system setups), `runner` (timing and the grid), `device` (bandwidth,
memory, MBU), `profile` (kernel time by kind), `report` (Markdown, JSON, plots); `policy_bench` (draft-length
policies against plain decoding, behind `specdec policies`).
"""
