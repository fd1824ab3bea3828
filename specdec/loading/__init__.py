"""Loading models and tokenizers from THIS machine, safely: folders, GGUF files, hub ids in the local cache.

What a user may name (`specdec.load`, `--target` / `--draft` of every subcommand):
  a checkpoint folder      config.json + safetensors (pickled .bin only with allow_pickle / --allow-pickle)
  a .gguf file             or a folder / hub id + model option gguf_file=NAME; needs `specdec[gguf]`
                           (gguf + accelerate); weights dequantized, tokenizer and chat template from the file
  a hub id (org/name)      resolved in the local Hugging Face cache (`source.py`), model option revision=;
                           never downloaded
Model options (`model_kwargs=` / `--model-option KEY=VALUE`) are validated (`options.py`); keys that would undo
the rules below are refused.

The rules, for every format: `local_files_only=True` and `trust_remote_code=False` always; the config and
weight headers are read by specdec before transformers runs (`checks.py`, `gguf.py`): custom code, unknown
model types, unbounded sizes, escaping shard paths, truncated or corrupt files, and layer counts the weights do
not hold are refused in one line naming the file; after loading, tensors the model lacks (randomly
initialised) or does not use are refused unless allow_weight_mismatch / --allow-weight-mismatch.

An outer-ring helper for the CLI, the text API, benchmarks, demos and the zoo; the core never imports it.
"""

from specdec.loading.checks import MAX_LAYERS, MAX_PARAMETERS, PICKLE_INDEX, SAFETENSORS_INDEX, inspect_checkpoint
from specdec.loading.device import DTYPES, quiet_progress_bars, resolve_device, resolve_dtype
from specdec.loading.gguf import inspect_gguf, require_gguf
from specdec.loading.load import load_model, load_tokenizer, placed_like, resolve_model_source
from specdec.loading.options import ModelOptions, check_model_options, parse_model_option, source_options
from specdec.loading.source import ModelSource, hub_cache_dir, resolve_source

__all__ = ["DTYPES", "resolve_device", "resolve_dtype", "inspect_checkpoint", "inspect_gguf", "require_gguf",
           "load_model", "load_tokenizer", "placed_like", "quiet_progress_bars", "ModelOptions", "check_model_options",
           "parse_model_option", "source_options", "ModelSource", "resolve_source", "resolve_model_source",
           "hub_cache_dir",
           "MAX_LAYERS", "MAX_PARAMETERS", "SAFETENSORS_INDEX", "PICKLE_INDEX"]
