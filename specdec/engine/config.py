"""Engine configuration and the error for models the engine does not cover."""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass

import torch

from specdec.request import as_int, check_num_draft_tokens

__all__ = ["EngineConfig", "UnsupportedModel", "BATCH_BUCKETS", "DEFAULT_MIXED_STEP", "MODEL_IMPLS", "MIN_POSITIONS",
           "positions_bucket", "length_buckets", "resolve_mixed_step", "resolve_async"]

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODEL_IMPLS = ("auto", "fast", "transformers")  # EngineConfig.model_impl (vLLM's names; "fast" for its "vllm")
MIN_POSITIONS = 64  # the shortest cache-length bucket a step attends over (buckets are powers of two)
DEFAULT_MIXED_STEP = "auto"  # EngineConfig.mixed_step's default: False, True or "auto" (`resolve_mixed_step`)


def positions_bucket(need: int, num_positions: int) -> int:
    """The positions a decode step attends over when its longest row needs `need` of a cache of `num_positions`:
    the power of two >= need (at least `MIN_POSITIONS`), or the whole cache when that power is within a quarter
    of it (a max_seq_len of 1024 makes a cache of 1034: one bucket 1034, not 1024 and 1034 — a step shape, and
    its captures, fewer for at most a quarter more positions)."""
    bucket = max(MIN_POSITIONS, 1 << max(int(need) - 1, 0).bit_length())
    return num_positions if bucket + bucket // 4 >= num_positions else bucket


def length_buckets(num_positions: int, limit: int | None = None) -> list[int]:
    """Every `positions_bucket` of a cache of `num_positions`, smallest first, up to the one holding `limit`
    positions (None: all)."""
    limit = num_positions if limit is None else min(int(limit), num_positions)
    buckets = [positions_bucket(1, num_positions)]
    while buckets[-1] < limit:
        buckets.append(positions_bucket(buckets[-1] + 1, num_positions))
    return buckets


class UnsupportedModel(ValueError):
    """The engine does not cover this model (architecture, attention variant); use engine='hf'."""


@dataclass(frozen=True)
class EngineConfig:
    """Sizes fixed at construction: nothing is re-allocated or re-captured while requests come and go.

    max_batch_size    requests decoded together; more wait in the queue (continuous batching)
    max_seq_len       prompt + generated tokens of one request; None = the model's context, at most 4096
    num_draft_tokens  γ: an int (fixed, exactly that γ every step) or "auto" (the engine picks γ in
                      {0, 1, .., max_draft_tokens} each step from measured step costs and acceptance)
    max_draft_tokens  the largest γ (sizes buffers; "auto" never goes beyond it)
    cuda_graphs       None = on CUDA; decode steps are captured once per (batch bucket, k, length bucket)
    prefill_chunk     prompt tokens per prefill forward (long prompts are prefilled in chunks)
    prefill_graphs    replay the prefill chunks of a request admitted alone into an empty engine as CUDA graphs
                      once their shape was seen before (eager prefill is launch-bound at batch 1); None = with
                      cuda_graphs
    synthetic_acceptance  BENCHMARK ONLY: accept each draft with this probability instead of the rule, to time
                      the engine at a chosen α (the output is then NOT the target's distribution)
    kernels           the layer kernels of the target and model drafters: "auto" (fused Triton kernels on CUDA
                      where Triton imports), "triton", "reference" (eager PyTorch); see FastLlama
    admit_min         while requests run, waiting ones are admitted once this many slots are free, or once a slot
                      has been free for `admit_max_wait` steps (an eager prefill is launch-bound: admitting 8
                      requests costs about what 1 does, ~7 ms on an H200, and every running row waits for it);
                      None = max_batch_size // 16, at least 1 (1: as soon as a slot frees), and 1 with a
                      prefill_budget (its chunks batch the filling rows: a group would only delay them; at 128
                      slots it held freed slots idle for up to `admit_max_wait` steps). With nothing running,
                      waiting requests are admitted at once.
    admit_max_wait    steps a free slot waits for `admit_min` (what it adds to a request's time to first token)
    prefill_budget    chunked prefill: prompt tokens prefilled per engine step while requests run (the target's and
                      a cached drafter's feeds together, oldest admitted request first), as vLLM's
                      max_num_batched_tokens / SGLang's chunked_prefill_size: a prompt admitted mid-flight holds its
                      slot and its chunks ride in the running rows' steps (the mixed step, `mixed_step`: one target
                      forward over the verify tokens and the chunks) until it is fed, then joins the decode steps; with
                      nothing running, admission prefills at once. Setting one turns the mixed step on where it can
                      run (`resolve_mixed_step`); where it cannot, prompts prefill whole at admission and the engine's
                      `prefill_budget` reads None. None or 0 with `mixed_step` on (the default "auto", where it runs):
                      "auto"; with mixed_step False: off, admitted prompts prefill whole before the step (every
                      running row waits for them). A
                      fixed budget below the traffic's prompt tokens per step starves the slots: on one H200 (zoo
                      pair, head, "auto", BENCHMARKS.md) 1,024 bounded the speculative ITL p99 at 8 / 32 clients
                      (1.20x / 1.40x plain's, from 3.18x / 2.02x) but at 64 / 128 clients held slots filling for
                      seconds (TTFT p50 1.4 / 3.6 s, 0.61x plain). "auto": derived from what the engine measures
                      (`engine/prefill_budget.py`): a step prefills for at most `prefill_stall` × the measured decode
                      step (tokens from the mixed steps' seconds fitted against their chunk tokens), and every request
                      is fed within `prefill_steps` steps (4 unless given)
    prefill_steps     with a prefill_budget: every request is fed within this many steps of its admission (a step
                      feeds more than the budget when the backlog needs it: the budget adapts to the load instead
                      of capping it, so slots cannot stay filling while the queue grows); None = the budget is a
                      hard cap (with "auto": 4). On one H200 "auto" (K = 4) bounded the ITL at 8 / 32 clients
                      and lost throughput at every load against budget off (BENCHMARKS.md)
    prefill_stall     with prefill_budget="auto": the prefill seconds a step may add, as a fraction of the measured
                      decode step (None = 0.5: a running stream's gap is at most 1.5 decode steps but where the
                      deadline needs more)
    mixed_step        the mixed prefill/decode step, the engine's one way of chunking prompts (vLLM's chunked
                      prefill, its V1 scheduler's mixed batches): while requests fill, a step runs ONE target forward
                      (`fast.ragged.forward_ragged`, over the paged pool's block tables) over the running rows' verify
                      tokens (1 + γ each) and the filling rows' prompt chunks, under the prefill budget
                      (`prefill_budget`; None or 0 = "auto"), so an admission never stops the running rows; a cached
                      drafter's feed of those chunks runs right after, in the same step (`engine/mixed_step.py`).
                      Steps with nothing filling are decode steps; a mixed step runs at one of a finite set of padded
                      shapes (`engine/mixed_shapes.py`: warmed, and graphed with cuda_graphs). False, True or "auto",
                      resolved once when the engine is built (`resolve_mixed_step`): True needs it supported — the
                      paged layout and a target body the ragged forward covers — (refused otherwise); "auto" is True
                      where supported, else False (`DEFAULT_MIXED_STEP`, the default: on one H200 the mixed step with
                      async scheduling ran plain decoding 1.27x faster under closed-loop traffic, ITL p99 40 -> 14 ms,
                      and the head drafter's "auto" at 0.99x the whole-prefill engine's, BENCHMARKS.md); False is off
                      unless a prefill_budget asks for chunks (prompts prefill whole: A/B runs). Where it is off, or in a step it cannot run, prompts prefill whole: token-tree
                      requests at admission (a tree step has no mixed form), and requests left filling when nothing
                      runs (no step to carry their chunks) the rest of their prompts at once
    bitwise           bit-for-bit exact mode: the target runs batch-invariant GEMM and attention kernels in every
                      forward (`fast.kernels.invariant`) and sampled rows verify by a shared race
                      (`core.verify_coupled`), so greedy and seeded output and log-probabilities are plain decoding's
                      bits alone or in any batch, for any γ and drafter; the Llama-body families, CPU and CUDA; no
                      leniency or token trees; costs speed (BENCHMARKS.md)
    max_tree_nodes    the largest token tree a request may ask for (`SamplingParams.draft_tree`), root included
                      (sizes the caches: a tree pass writes that many slots; 0 = no trees; at most 64)
    kv_layout         "paged" (the default; None resolves to it): one pool of fixed-size blocks per model
                      (`engine/kv_pool.py`), sized by kv_cache_memory, a block
                      table per row, blocks taken as a request grows and returned when it leaves; a request that
                      needs a block when none is free is preempted (its blocks freed, re-queued first, recomputed
                      on readmission, vLLM's recompute preemption); steps captured as CUDA graphs over the block
                      table like static ones; token trees and beam groups (their prompt's blocks shared
                      copy-on-write). "static": every slot owns K/V for max_seq_len positions, allocated at
                      construction (slots × longest request). bitwise=True stays on "static" (None resolves to
                      it): its batch-invariant fused layer reads a static cache; kv_layout="paged" with it is refused
    block_size        positions per block of the paged pool (vLLM's name; a power of two in [1, 64])
    kv_cache_memory   the paged pool's budget: an int of bytes, or a float in (0, 1]: that fraction of the memory
                      free at construction (vLLM's gpu_memory_utilization, of free memory); None = the bytes the
                      static layout would take, at most 2 GiB and half the free memory on CPU (vLLM's CPU KV space
                      default is a fixed size too), at most 0.9 of the free memory on CUDA
    model_impl        which body runs the target and a model drafter (vLLM's `--model-impl`): "auto" (the default)
                      the fast family bodies (`fast/families.py`) where they cover the model, else the transformers
                      backend (`fast/hf_backend.py`: the model's own modules with the engine's attention and cache,
                      one log line naming the model type); "fast" the family bodies only (else `UnsupportedModel`);
                      "transformers" the backend for every model
    enable_prefix_caching  paged pool only (vLLM's name): full blocks of committed text stay cached, named by a hash
                      chain, and a later prompt starting with them skips their prefill, the target's and a cached
                      drafter's or a feature head's (`engine/prefix_cache.py`); None (the default) = on with
                      kv_layout="paged" (vLLM's default), off with the static layout; False for A/B runs
    async_scheduling  the host ahead of the device (vLLM's name): steady-state decode steps are launched before the
                      previous step's record is read, finished rows masked on the device (`engine/async_steps.py`);
                      a fixed-γ row's tokens unchanged (one added while a step runs ahead joins a step later); an
                      "auto" step's γ is chosen from the last record read, one step late (`engine/async_plan.py`:
                      sampled tokens then follow that γ sequence, the target's law unchanged). None (the default):
                      on where the engine's device is CUDA, off on the CPU (`resolve_async`: there each step has run
                      when it is launched, nothing to overlap); True / False as given
    gguf_weights      a model read from a GGUF, on the CPU in float32: "quantized" keeps the file's blocks and
                      multiplies by 8-bit activations (`fast.quant`), "dequantized" keeps dense float32 weights;
                      "auto" = the process default (`--gguf-weights`, env SPECDEC_GGUF_WEIGHTS), else
                      "dequantized" (docs/benchmarks/quantized_cpu.md says why)
    """

    max_batch_size: int = 64
    max_seq_len: int | None = None
    num_draft_tokens: int | str = "auto"
    max_draft_tokens: int = 8
    cuda_graphs: bool | None = None
    prefill_chunk: int = 512
    prefill_graphs: bool | None = None
    synthetic_acceptance: float | None = None
    kernels: str = "auto"
    bitwise: bool = False
    max_tree_nodes: int = 32
    admit_min: int | None = None
    admit_max_wait: int = 8
    prefill_budget: int | str | None = None
    prefill_steps: int | None = None
    prefill_stall: float | None = None
    mixed_step: bool | str = DEFAULT_MIXED_STEP
    kv_layout: str | None = None
    block_size: int = 16
    kv_cache_memory: int | float | None = None
    enable_prefix_caching: bool | None = None  # None: on with the paged pool (resolved in __post_init__)
    model_impl: str = "auto"
    gguf_weights: str = "auto"
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}, got {self.model_impl!r}")
        if self.kv_layout is None:  # (bitwise=True: the batch-invariant fused layer reads a static cache)
            object.__setattr__(self, "kv_layout", "static" if self.bitwise is True else "paged")
        if self.kv_layout not in ("static", "paged"):
            raise ValueError(f"kv_layout must be 'static' or 'paged', got {self.kv_layout!r}")
        as_int(self.block_size, "block_size", minimum=1, maximum=64)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two in [1, 64], got {self.block_size}")
        memory = self.kv_cache_memory
        if memory is not None:
            if isinstance(memory, float):
                if not 0.0 < memory <= 1.0:
                    raise ValueError(f"kv_cache_memory as a float is a fraction of free memory in (0, 1], got {memory}")
            else:
                as_int(memory, "kv_cache_memory", minimum=1, maximum=1 << 50)
            if self.kv_layout != "paged":
                raise ValueError(f"kv_cache_memory={memory!r} sizes the paged pool: it needs kv_layout='paged'")
        if self.gguf_weights not in ("auto", "quantized", "dequantized"):
            raise ValueError(f"gguf_weights must be 'auto', 'quantized' or 'dequantized', got {self.gguf_weights!r}")
        if self.enable_prefix_caching is None:
            object.__setattr__(self, "enable_prefix_caching", self.kv_layout == "paged")
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be True, False or None, got {self.enable_prefix_caching!r}")
        if self.enable_prefix_caching and self.kv_layout != "paged":
            raise ValueError("enable_prefix_caching=True shares KV blocks: it needs kv_layout='paged'")
        as_int(self.max_batch_size, "max_batch_size", minimum=1, maximum=BATCH_BUCKETS[-1])
        if self.admit_min is not None:
            as_int(self.admit_min, "admit_min", minimum=1, maximum=self.max_batch_size)
        as_int(self.admit_max_wait, "admit_max_wait", minimum=0, maximum=1 << 20)
        budget = self.prefill_budget
        if budget is not None and budget != "auto" and not (budget == 0 and type(budget) is int):
            if isinstance(budget, str):
                raise ValueError(f"prefill_budget must be None, 0, 'auto' or an int of prompt tokens per step, "
                                 f"got {budget!r}")
            as_int(budget, "prefill_budget", minimum=16, maximum=1 << 20)
        mixed = self.mixed_step
        if not (isinstance(mixed, bool) or (isinstance(mixed, str) and mixed == "auto")):
            raise TypeError(f"mixed_step must be True, False or 'auto', got {mixed!r}")
        if mixed is True and self.kv_layout != "paged":
            raise ValueError("mixed_step=True runs over the paged pool's block tables: it needs kv_layout='paged'")
        if mixed and not budget:
            budget = "auto"  # (the mixed step's token budget: measured, `prefill.ChunkBudget`)
        if self.prefill_steps is not None:
            as_int(self.prefill_steps, "prefill_steps", minimum=1, maximum=1 << 10)
            if not budget:
                raise ValueError(f"prefill_steps={self.prefill_steps} needs a prefill_budget or mixed_step "
                                 "(chunked prefill is off)")
        stall = self.prefill_stall
        if stall is not None:
            if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not 0.01 <= stall <= 100:
                raise ValueError(f"prefill_stall must be a fraction of the decode step in [0.01, 100], got {stall!r}")
            if budget != "auto":
                raise ValueError(f"prefill_stall={stall} needs prefill_budget='auto' (got {budget!r})")
        if self.max_seq_len is not None:
            as_int(self.max_seq_len, "max_seq_len", minimum=2, maximum=1 << 20)
        check_num_draft_tokens(self.max_draft_tokens, "max_draft_tokens")
        if self.num_draft_tokens != "auto":
            as_int(self.num_draft_tokens, "num_draft_tokens", minimum=0, maximum=self.max_draft_tokens)
        as_int(self.prefill_chunk, "prefill_chunk", minimum=16, maximum=1 << 16)
        as_int(self.max_tree_nodes, "max_tree_nodes", minimum=0, maximum=64)
        a = self.synthetic_acceptance
        if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0):
            raise ValueError(f"synthetic_acceptance must be None or in [0, 1], got {a!r}")
        if self.kernels not in ("auto", "triton", "reference"):
            raise ValueError(f"kernels must be 'auto', 'triton' or 'reference', got {self.kernels!r}")
        if not isinstance(self.bitwise, bool):
            raise TypeError(f"bitwise must be True or False, got {self.bitwise!r}")
        if self.bitwise and self.kv_layout == "paged":
            raise ValueError("bitwise=True runs on kv_layout='static' (its batch-invariant fused layer reads a static "
                             "KV cache)")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise TypeError(f"async_scheduling must be None, True or False, got {self.async_scheduling!r}")
        if self.cuda_graphs not in (None, True, False):
            raise TypeError(f"cuda_graphs must be None, True or False, got {self.cuda_graphs!r}")
        if self.prefill_graphs not in (None, True, False):
            raise TypeError(f"prefill_graphs must be None, True or False, got {self.prefill_graphs!r}")


def resolve_mixed_step(config: EngineConfig, covered: bool, body: str = "this body") -> EngineConfig:
    """`config` with `mixed_step` resolved to True or False, once, when the engine is built (`Runner`): the mixed
    step is supported where the layout is "paged" (not "static", so never with bitwise=True) and `covered` — the
    built target's body is one `fast.ragged.forward_ragged` runs (`fast.ragged.covers`: the fast Llama body, a
    tensor-parallel shard of it; not the transformers backend or a body of its own). True where unsupported is
    refused (a ValueError naming why); "auto", or False with a `prefill_budget` set, is True where supported, else
    False (prompts prefill whole, the budget unused); False without a budget stays False. `body`: the target's
    body, named in the refusal."""
    supported = config.kv_layout == "paged" and covered
    mixed = config.mixed_step
    if mixed is True and not supported:
        raise ValueError(f"mixed_step=True runs the fast Llama body's ragged forward; this target runs on {body} "
                         "(mixed_step='auto' prefills prompts whole where the mixed step cannot run)")
    resolved = supported if mixed is True or mixed == "auto" or config.prefill_budget else False
    if resolved is mixed:
        return config
    out = copy(config)  # (not `replace`: the options checked once stay as given, the budget's too)
    object.__setattr__(out, "mixed_step", resolved)
    return out


def resolve_async(config: EngineConfig, device: torch.device) -> bool:
    """Whether the engine runs the host ahead of the device (`EngineConfig.async_scheduling`): as given, or for None
    (the default) on where the engine's device is CUDA — there the host's bookkeeping overlaps the step in flight —
    and off on the CPU, where each step has run by the time it is launched (nothing to overlap; an "auto" γ would
    only be chosen a record late)."""
    if config.async_scheduling is not None:
        return config.async_scheduling
    return torch.device(device).type == "cuda"
