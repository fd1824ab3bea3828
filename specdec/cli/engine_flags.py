"""The engine's options on the command line: one table, `ENGINE_FLAGS`, from flags to `EngineConfig` fields.

Every command that builds an engine (`serve`, `generate`) adds the table's flags (`add_engine_flags`) and reads them
back as `specdec.load`'s engine options (`engine_options`: only the flags given; the others keep the library's
defaults), checked before anything loads by the library's own checks (`check_engine_flags`), each error naming the
flag. A new engine option is a field of `EngineConfig` plus, to reach the command line, a row here. Imports nothing
heavy (`specdec --help` builds every parser); a test checks each row names an `EngineConfig` field.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from specdec.cli import CLIError

__all__ = ["EngineFlag", "ENGINE_FLAGS", "add_engine_flags", "engine_options", "check_engine_flags", "parse_mixed_step"]

#: --model-impl: the engine's body for the target (`EngineConfig.model_impl`, vLLM's flag and names)
MODEL_IMPLS = ("auto", "fast", "transformers")


def _int_or_auto(text: str):
    """--prefill-budget: "auto" or a number of tokens (0 = off); anything else goes to the engine's check as it is."""
    text = text.strip()
    return int(text) if text.isdigit() else text


#: --mixed-step's words for `EngineConfig.mixed_step`'s values (a bare --mixed-step is True)
MIXED_STEP_WORDS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False,
                    "0": False, "auto": "auto"}


def parse_mixed_step(text: str):
    """--mixed-step's value: true / false / auto (and on / off, yes / no, 1 / 0), or argparse's error naming them."""
    word = text.strip().lower()
    if word not in MIXED_STEP_WORDS:
        hint = (" — a model path right after the flag is read as its value: put the model first, or write "
                "--mixed-step true" if "/" in text or "." in text else "")
        raise argparse.ArgumentTypeError(f"{text!r} is not true, false or auto (a bare --mixed-step is true){hint}")
    return MIXED_STEP_WORDS[word]


@dataclass(frozen=True)
class EngineFlag:
    """One row: the flags (specdec's first, then vLLM's / llama.cpp's spellings), the `EngineConfig` field they set,
    and argparse's keywords (`default` is always None: a flag not given leaves the library's default)."""

    flags: tuple[str, ...]
    option: str
    kwargs: dict = field(default_factory=dict)


ENGINE_FLAGS = (
    EngineFlag(("--max-batch-size", "--max-num-seqs"), "max_batch_size", dict(
        type=int, metavar="N", help="requests decoded together; more wait in the queue (vLLM's --max-num-seqs; "
        "default: 32, generate: the number of prompts)")),
    EngineFlag(("--max-seq-len", "--max-model-len", "-c", "--ctx-size"), "max_seq_len", dict(
        type=int, metavar="TOKENS", help="context per request (default: the model's, at most 4096; generate: the "
        "prompts' + --max-new-tokens; vLLM's --max-model-len, llama.cpp's -c)")),
    EngineFlag(("--kv-cache-memory",), "kv_cache_memory", dict(
        metavar="SIZE", help="the paged KV pool's budget: bytes (4GiB, 512MiB, 2G, 1073741824) or a fraction in (0, 1] "
        "of the memory free when the engine is built, after the weights (default: at most 0.9 of the free GPU memory; "
        "2 GiB on a CPU); a full pool preempts requests, never fails them. Not vLLM's --gpu-memory-utilization, "
        "a fraction of the whole GPU")),
    EngineFlag(("--kv-cache-memory-bytes",), "kv_cache_memory", dict(
        dest="kv_cache_memory_bytes", metavar="BYTES", help="vLLM's spelling of --kv-cache-memory in bytes (4GiB, 4294967296)")),
    EngineFlag(("--block-size",), "block_size", dict(
        type=int, metavar="TOKENS", help="positions per block of the paged KV pool, a power of two in [1, 64] "
        "(vLLM's flag; default: 16)")),
    EngineFlag(("--enable-prefix-caching",), "enable_prefix_caching", dict(
        action="store_const", const=True, help="prompts reuse the KV blocks of text served before (the engine's prefix "
        "cache, on the paged KV pool; vLLM's flag) (default: the engine's: on with the paged pool)")),
    EngineFlag(("--no-enable-prefix-caching", "--no-prefix-caching"), "enable_prefix_caching", dict(
        action="store_const", const=False, help="prefix caching off (for A/B runs; vLLM's spelling first)")),
    EngineFlag(("--prefill-budget",), "prefill_budget", dict(
        type=_int_or_auto, metavar="TOKENS", help="chunked prefill: prompt tokens prefilled per engine step while "
        "requests run, riding in the running rows' forwards (the mixed step, on wherever it runs); 0: off, admitted "
        "prompts prefill whole; auto: a step prefills for at most --prefill-stall of the measured decode step, each "
        "request fed within --prefill-steps, 4 (default: 0, or auto with --mixed-step)")),
    EngineFlag(("--prefill-steps",), "prefill_steps", dict(
        type=int, metavar="K", help="with --prefill-budget: every request is fed within K steps of its admission (the "
        "budget grows with the backlog) (default: the budget is a hard cap; auto: 4)")),
    EngineFlag(("--prefill-stall",), "prefill_stall", dict(
        type=float, metavar="FRACTION", help="with --prefill-budget auto: the prefill seconds a step may add, as a "
        "fraction of the measured decode step (default: 0.5)")),
    EngineFlag(("--mixed-step",), "mixed_step", dict(
        nargs="?", const=True, type=parse_mixed_step, metavar="true|false|auto", help="with requests filling, one forward "
        "per step over the running rows' verify tokens and the filling rows' prompt chunks (EngineConfig.mixed_step; "
        "its budget: --prefill-budget, auto when not given); true (a bare --mixed-step) needs the paged KV pool and "
        "the fast Llama body, auto runs it where they are and prefills whole elsewhere; false prefills every prompt "
        "whole (default: auto)")),
    EngineFlag(("--model-impl",), "model_impl", dict(
        choices=MODEL_IMPLS, help="the engine's body for the target: auto (the fast family bodies where they cover "
        "the model, else the transformers backend), fast, transformers (the engine's transformers backend: the model's own "
        "modules with the engine's attention and KV cache, continuous batching for any decoder) (vLLM's flag)")),
    EngineFlag(("--bitwise",), "bitwise", dict(
        action="store_true", help="bit-for-bit exact mode: a request's greedy / seeded output and logprobs do not "
        "depend on the batch, γ or speculation (batch-invariant kernels; slower; needs the engine)")),
    EngineFlag(("--async-scheduling",), "async_scheduling", dict(
        action=argparse.BooleanOptionalAction, help="the host prepares and launches the next decode step before it "
        "reads the last one's output (vLLM's flag; \"auto\" chooses the step's γ one record late; greedy tokens "
        "unchanged); --no-async-scheduling reads every record first (default: on with CUDA, off on the CPU)")),
    EngineFlag(("--synthetic-acceptance",), "synthetic_acceptance", dict(
        type=float, metavar="ALPHA", help="BENCHMARK ONLY: accept each draft with probability ALPHA (a random pair "
        "at a known α); the output is then NOT the target's distribution")),
)


def _dest(row: EngineFlag) -> str:
    return row.kwargs.get("dest", row.option)


def add_engine_flags(parser) -> None:
    """The table's flags, in an "engine options" group (or `parser` itself when it is a group)."""
    group = parser if isinstance(parser, argparse._ArgumentGroup) else parser.add_argument_group(
        "engine options (specdec.load's, EngineConfig's fields)")
    for row in ENGINE_FLAGS:
        group.add_argument(*row.flags, default=None, **{"dest": row.option, **row.kwargs})


def engine_options(args: argparse.Namespace) -> dict:
    """{EngineConfig field: value} for the table's flags that were given; a field given by two flags is refused."""
    options: dict = {}
    given: dict = {}
    for row in ENGINE_FLAGS:
        value = getattr(args, _dest(row), None)
        if value is None:
            continue
        if row.option in options and options[row.option] != value:
            raise CLIError(f"{row.flags[0]} and {given[row.option]} set the same option ({row.option}): give one")
        options[row.option], given[row.option] = value, row.flags[0]
    if "kv_cache_memory" in options and given["kv_cache_memory"] == "--kv-cache-memory-bytes" and \
            re.fullmatch(r"\s*0?\.\d+\s*|\s*1\.0*\s*", str(options["kv_cache_memory"])):
        raise CLIError(f"--kv-cache-memory-bytes takes bytes (e.g. 4GiB), got {options['kv_cache_memory']!r}; a "
                       "fraction of the free memory is --kv-cache-memory")
    return options


def _flag_of(message: str, options: dict) -> str:
    """The flag of the option a library error names first (`EngineConfig`'s errors name the field)."""
    found = [(message.find(row.option), row.flags[0]) for row in ENGINE_FLAGS
             if row.option in options and row.option in message]
    found += [(message.find(row.option), row.flags[0]) for row in ENGINE_FLAGS if row.option in message]
    return min(found)[1] if found else "engine options"


def check_engine_flags(args: argparse.Namespace, *, num_draft_tokens=None, loop: bool = False) -> dict:
    """`engine_options(args)` checked by the library (`specdec.text.options`: the names, sizes, `EngineConfig`'s
    checks; `loop`: what the eager loop cannot honour), before anything loads; a CLIError naming the flag."""
    from specdec.text.options import check_engine_options, engine_config, loop_refusal

    options = engine_options(args)
    try:
        checked = check_engine_options(options)
        gamma = num_draft_tokens if num_draft_tokens == "auto" or type(num_draft_tokens) is int else None
        engine_config(checked, gamma or None)
        refusal = loop_refusal(checked) if loop else None
        if refusal is not None:
            raise ValueError(f"not with --engine hf: {refusal}")
    except (ValueError, TypeError) as err:
        raise CLIError(f"{_flag_of(str(err), options)}: {err}") from None
    return checked
