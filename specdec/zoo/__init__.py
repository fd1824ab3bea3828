"""Model zoo: train our own target/draft pairs from data already on the machine.

Terms used across the package:

- corpus: documents read from local files. `code` = the Python sources visible to the interpreter
  (stdlib + site-packages); `ende` = English→German message pairs from gettext catalogs (`*.mo`).
  Deduplicated by content hash; the validation split is chosen by hashing whole FILES, so no file
  contributes to both splits.
- prepared data folder: what `prepare_code_data` / `prepare_ende_data` write: a tokenizer folder plus
  token arrays (code) or gzip'd JSON lines (ende) and a `meta.json`; small enough to carry to a GPU machine.
- preset: a frozen description of a target/draft pair (shapes + training budgets), see `presets.py`.
- distillation: fine-tuning the drafter q on the target's soft distribution p (KL(p‖q)) to raise α.

Modules: `corpus` (read + split), `tokenizer` (byte-level BPE), `train` (models, loop, saving),
`distill` (KL fine-tuning, α on held-out text), `presets`, `pipeline` (data prep + whole-pair recipes),
`images` (8×8 digit images as pixel tokens: layout, data, presets and the pair recipe; scikit-learn).
Nothing here is imported by the decoding core.
"""
