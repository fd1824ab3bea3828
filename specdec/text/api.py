"""`specdec.load(...)`: text in, text out, over the request-level engine (or the eager loop where it cannot run).

    llm = specdec.load("path/to/target", draft="path/to/draft")      # or "prompt-lookup", "ngram"
    llm.generate("def fib(n):", max_new_tokens=64).text      # or vLLM's shapes: text/shapes.py
    for delta in llm.stream([{"role": "user", "content": "hi"}], temperature=0.7, seed=0):
        print(delta, end="")

Defaults come from the target's generation_config (greedy unless do_sample), explicit arguments win.
Requests run on one background thread (`Driver`); `generate`/`stream` block only the calling thread.
One runner (one engine, one KV cache) serves every request: plain (`num_draft_tokens=0`), any γ and "auto" share its
batches (`SamplingParams.num_draft_tokens`, each row's own draft cap).
"""

from __future__ import annotations

import gc
import itertools
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from specdec.request import MAX_NUM_DRAFT_TOKENS, as_int, resolve_eos
from specdec.text.driver import Driver
from specdec.text.drafts import load_draft
from specdec.text.outputs import Completion, TextDelta, TextRequest
from specdec.text.prompts import (GenerationDefaults, check_default_gamma, check_num_draft_tokens, encode_prompts,
                                  gamma_label, make_params, read_chat_template, render_chat)
from specdec.text.options import check_engine_options, engine_config, loop_refusal
from specdec.text.runner import FallbackRunner, RunnerSpec, build_runner
from specdec.text.shapes import check_conversations, request_params, shape_outputs
from specdec.text.warmup import cache_bytes, graph_captures, step_shapes, step_shapes_run

__all__ = ["load", "LLM", "TextStream"]

RUNNERS = ("auto", "engine", "fallback")


def load(target, draft=None, *, tokenizer=None, device="auto", dtype="auto", num_draft_tokens=4,
         chat_template: str | None = None, allow_pickle: bool = False, runner: str = "auto", ngram_data=None,
         tensor_parallel_size: int = 1, tensor_parallel_all_reduce: str = "auto", model_kwargs: dict | None = None,
         draft_model_kwargs: dict | None = None, allow_weight_mismatch: bool = False, **engine_options) -> "LLM":
    """Load a target (and a draft) for text generation.

    target          a checkpoint folder, a .gguf file, a hub id (org/name) in the local Hugging Face cache
                    (never downloaded), or a transformers model (then pass `tokenizer`)
    draft           None | a folder / .gguf / hub id | a transformers model | "prompt-lookup" | "ngram" (fit on
                    `ngram_data`: a text file or a list of strings) | a specdec Drafter
    tokenizer       a folder, .gguf file, hub id or tokenizer object (default: the target's, with its chat template)
    model_kwargs    validated from_pretrained options for the target (`specdec.loading.options`): revision,
                    gguf_file, subfolder, cache_dir, torch_dtype, device_map, max_memory, attn_implementation,
                    quantization_config, low_cpu_mem_usage, variant; `draft_model_kwargs` the same for the draft
    allow_weight_mismatch  load checkpoints whose weights do not fill the model (missing tensors would be
                    randomly initialised) or hold tensors it does not use; refused by default
    num_draft_tokens default γ of a request that names none (an int, "auto", or a draft-length policy — a name,
                    "heuristic", ..., or a `DraftLengthPolicy` object — choosing the engine's γ each step); 0 = plain
                    decoding. A request's own γ (0, 1..8 or "auto"; not a policy) runs on the same engine, batched
    chat_template   a Jinja chat template (string or file) replacing the tokenizer's own
    allow_pickle    load .bin/.pt weights (pickle can run code); safetensors only by default
    runner          "auto": the request-level engine (a fast family body, else the transformers backend:
                    `EngineConfig.model_impl`), the eager loop only for a model or drafter it refuses;
                    "engine" / "fallback" to force one
    tensor_parallel_size  N > 1: run under `torchrun --nproc-per-node N`; every rank loads its shard of the
                    target folder; rank 0 gets the LLM, the other ranks follow its steps and exit the process
                    when rank 0 closes it (`specdec/text/tensor_parallel.py`); γ an int, "auto" or a policy (rank 0 decides)
    tensor_parallel_all_reduce  how the ranks sum the row-parallel products: "auto" (one_shot where the GPUs
                    reach each other by P2P, else group), "group" (NCCL / gloo) or "one_shot" (torch symmetric
                    memory over NVLink, CUDA); see `specdec.distributed.allreduce`
    engine_options  the engine's options by `specdec.engine.EngineConfig`'s field names, each documented and checked
                    there (`text/options.py`): max_batch_size (32 here), max_seq_len (None: the model's context),
                    kv_cache_memory (the paged KV pool: bytes, "4GiB", or a fraction of the free memory), block_size,
                    enable_prefix_caching, bitwise (bit-for-bit exact mode; one device), prefill_budget /
                    prefill_steps / prefill_stall (chunked prefill), model_impl, synthetic_acceptance (BENCHMARK
                    ONLY: the output is then NOT the target's distribution), ...; an unknown name is a TypeError
                    naming it. The eager loop honours max_batch_size and max_seq_len and refuses the others by name
    """
    from specdec.loading import load_model, load_tokenizer, source_options
    from specdec.drafters.protocol import check_drafter_argument
    from specdec.fast.held_quantized import release_when_built

    check_drafter_argument(draft, "draft")  # (its kind, before anything loads)
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    tensor_parallel_size = as_int(tensor_parallel_size, "tensor_parallel_size", minimum=1, maximum=1024)
    from specdec.distributed.allreduce import check_all_reduce

    if check_all_reduce(tensor_parallel_all_reduce) != "auto" and tensor_parallel_size == 1:
        raise ValueError(f"tensor_parallel_all_reduce={tensor_parallel_all_reduce!r} needs tensor_parallel_size > 1")
    options = _checked_options(engine_options, runner, num_draft_tokens)  # (before anything loads)
    if options.get("bitwise") and tensor_parallel_size > 1:
        raise ValueError("bitwise=True needs the request-level engine on one device (not tensor_parallel_size > 1)")
    if tensor_parallel_size > 1:
        if model_kwargs is not None or allow_weight_mismatch:
            raise ValueError("tensor_parallel_size > 1 reads a safetensors folder per rank: model_kwargs and "
                             "allow_weight_mismatch are not supported with it")
        from specdec.text.tensor_parallel import check_gamma, load_tensor_parallel

        check_gamma(check_default_gamma(num_draft_tokens))

        def make_llm(model, channel):
            tok = tokenizer if tokenizer is not None else target
            tok = load_tokenizer(tok) if isinstance(tok, (str, Path)) else tok
            if chat_template is not None:
                tok.chat_template = read_chat_template(chat_template)
            drafter = load_draft(draft, model, tok, allow_pickle, ngram_data, draft_model_kwargs=draft_model_kwargs)
            return LLM(model, tok, drafter, num_draft_tokens=num_draft_tokens, runner=runner, tensor_parallel=channel,
                       **options)

        return load_tensor_parallel(target, tensor_parallel_size, device=device, dtype=dtype, make_llm=make_llm,
                                    all_reduce=tensor_parallel_all_reduce)
    tokenizer_kwargs = None
    if isinstance(target, (str, Path)):
        if tokenizer is None:  # the target's own: same revision / gguf_file / subfolder
            tokenizer, tokenizer_kwargs = target, model_kwargs
    elif model_kwargs is not None:
        raise ValueError("model_kwargs apply when target is a path or hub id, not a model object")
    elif tokenizer is None:
        raise ValueError("tokenizer is required when target is a model object (pass a folder or a tokenizer)")
    if isinstance(tokenizer, (str, Path)):  # (before the weights: a malformed tokenizer costs no weight read)
        tokenizer = load_tokenizer(tokenizer, model_kwargs=source_options(tokenizer_kwargs))
    target_model = target
    if isinstance(target, (str, Path)):
        target_model = load_model(target, device=device, dtype=dtype, what="target", allow_pickle=allow_pickle,
                                  model_kwargs=model_kwargs, allow_weight_mismatch=allow_weight_mismatch)
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    drafter = load_draft(draft, target_model, tokenizer, allow_pickle, ngram_data,
                          draft_model_kwargs=draft_model_kwargs, allow_weight_mismatch=allow_weight_mismatch)
    release_when_built(target, target_model, draft, drafter)  # (a GGUF kept quantized: no dense copy beside it)
    return LLM(target_model, tokenizer, drafter, num_draft_tokens=num_draft_tokens, runner=runner, **options)


def _checked_options(engine_options: dict, runner: str, num_draft_tokens) -> dict:
    """The engine options, each name known and each value checked by building the `EngineConfig` once (γ where it is
    the engine's kind), and refused by name on runner='fallback' when the loop cannot honour them."""
    options = check_engine_options(engine_options)
    gamma = num_draft_tokens if num_draft_tokens == "auto" or type(num_draft_tokens) is int else None
    engine_config(options, gamma if gamma != 0 else None)
    refusal = loop_refusal(options) if runner == "fallback" else None
    if refusal is not None:
        raise ValueError(refusal)
    return options


class LLM:
    """A target (+ drafter) and its tokenizer, serving text requests through runners on a background thread.
    `engine_options`: `load`'s (EngineConfig's fields by name)."""

    def __init__(self, target, tokenizer, drafter=None, *, num_draft_tokens=4, runner: str = "auto",
                 tensor_parallel=None, **engine_options):
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
        self.target = target
        self.tensor_parallel = tensor_parallel  # a CommandChannel under torchrun (text/tensor_parallel.py), or None
        self._tensor_parallel_started = False
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.runner_choice = runner
        self.num_draft_tokens = check_default_gamma(num_draft_tokens if drafter is not None else 0)
        if drafter is not None and self.num_draft_tokens == 0:
            raise ValueError("num_draft_tokens must be >= 1 when a draft is given (requests may still ask for "
                             "num_draft_tokens=0, plain decoding)")
        #: the engine options as given (`text.options`; what the runner is built from, read-only)
        self.engine_options = MappingProxyType(_checked_options(engine_options, runner, self.num_draft_tokens))
        # an encoder-decoder's prompt is the encoder's input, not text its output continues
        self._continues_prompt = not getattr(getattr(target, "config", None), "is_encoder_decoder", False)
        eos = resolve_eos(None, target) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self.defaults = GenerationDefaults.from_model(target, eos)
        self.driver = Driver()
        self._runner = None  # the one runner: every request, whatever its γ (`runner`)
        self.warmups: dict = {}  # the default γ (`gamma_label`) → the start-up capture's report (`text.warmup.warm_up`), CUDA only
        self._runner_lock = threading.Lock()
        self._ids = itertools.count()
        first = self.runner()  # fails now (not at the first request) on a bad setup
        self.runner_kind = "fallback" if isinstance(first, FallbackRunner) else "engine"
        self.vocab_size = int(first.vocab_size)
        self.max_seq_len = int(first.max_seq_len)
        self._tensor_parallel_started = True  # runners made from now on are made on every rank by command

    @property
    def bitwise(self) -> bool:
        return bool(self.engine_options.get("bitwise", False))

    @property
    def synthetic_acceptance(self) -> float | None:
        """BENCHMARK ONLY (see `load`): drafts accepted with this probability, or None."""
        return self.engine_options.get("synthetic_acceptance")

    # --- the runner ---------------------------------------------------------------------------------
    def runner(self, num_draft_tokens=None):
        """The one runner, serving every request (plain, any γ, "auto": one engine, one KV cache); built at load,
        rebuilt only after a step of it raised. `num_draft_tokens`: a request's γ, checked against this model."""
        if num_draft_tokens is not None:
            self.check_gamma(num_draft_tokens)
        with self._runner_lock:
            current = self._runner
            if current is not None and current not in self.driver.failed:
                return current
            self._runner = made = self._make_runner()
            if gc.get_freeze_count():  # the process froze its start-up heap (`specdec serve`): a runner rebuilt
                gc.freeze()  # later joins it, or each full collection walks its objects
            return made

    def check_gamma(self, num_draft_tokens):
        """A request's γ checked against this model (a draft for γ ≠ 0; an int or "auto" under tensor parallelism)."""
        key = check_num_draft_tokens(num_draft_tokens)
        if key != 0 and self.drafter is None:
            raise ValueError(f"num_draft_tokens={key!r} needs a draft model; this model was loaded without one")
        if self.tensor_parallel is not None:
            from specdec.text.tensor_parallel import check_gamma

            check_gamma(key)
        return key

    def _make_runner(self):
        if self.tensor_parallel is not None:
            from specdec.text.tensor_parallel import make_runner

            return make_runner(self, announce=self._tensor_parallel_started)
        return self._build_runner()

    def _build_runner(self):
        """The engine (or the eager loop where it cannot run: `text.runner.build_runner`), with the drafter."""
        spec = RunnerSpec(self.runner_choice, self.num_draft_tokens, self.engine_options)
        runner, report = build_runner(self.target, self.drafter, spec)
        if report is not None:
            self.warmups[gamma_label(self.num_draft_tokens)] = report
        return runner

    # --- requests -------------------------------------------------------------------------------------
    def prepare(self, prompt, sampling_params=None, **params):
        """(prompt_ids, SamplingParams, stop strings, γ) for one prompt, every argument checked."""
        batch, single = encode_prompts(prompt, self.tokenizer, self.vocab_size)
        if not single:
            raise ValueError(f"prompt must be one prompt (a string, token ids or chat messages), got {len(batch)}")
        ids = batch[0]
        _, (requests,), _ = request_params([ids], sampling_params, params, stream=True)
        sampling, stop, gamma = make_params(self, len(ids), requests)
        return ids, sampling, stop, gamma

    def submit(self, prompt_ids, sampling, stop, gamma, sink, request_id: str | None = None) -> TextRequest:
        """Start a request; `sink` gets its RequestOutputs (then maybe an Exception) on the driver thread. `gamma`: the
        γ it asks for (None or this model's default: `sampling.num_draft_tokens` as it is; another: the request's)."""
        if gamma is not None and sampling.num_draft_tokens is None and gamma != self.num_draft_tokens:
            sampling = replace(sampling, num_draft_tokens=gamma)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        request = TextRequest(rid, self.tokenizer, prompt_ids, stop, logprobs=sampling.logprobs,
                              decode_context=prompt_ids if self._continues_prompt else (),
                              min_tokens=sampling.min_tokens)
        self.driver.submit(self.runner(sampling.num_draft_tokens), prompt_ids, sampling, sink, rid)
        return request

    def abort(self, request_id: str) -> None:
        self.driver.abort(request_id)

    def runner_key(self, runner):
        """The default num_draft_tokens of `runner` if this model holds it (`gamma_label`; None for another)."""
        return gamma_label(self.num_draft_tokens) if runner is self._runner and runner is not None else None

    @property
    def num_runners(self) -> int:
        """Runners (engines) this model holds: one, whatever γ its requests ask for."""
        return int(self._runner is not None)

    @property
    def max_draft_tokens(self) -> int:
        """The largest γ a request may ask for (0 without a draft; the engine's `max_draft_tokens`)."""
        most = getattr(self._runner, "max_draft_tokens", MAX_NUM_DRAFT_TOKENS)
        return int(most) if self.drafter is not None else 0

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of K/V cache the runner holds (the target's and a cached drafter's; 0 for the fallback runner)."""
        return cache_bytes(self._runner)

    @property
    def graph_captures(self) -> int:
        """CUDA graph pairs captured by the runner so far (start-up warm-up included; 0 on CPU)."""
        return graph_captures(self._runner)

    @property
    def step_shapes(self) -> int:
        """Distinct decode step shapes the runner has built (eager or captured)."""
        return step_shapes(self._runner)

    @property
    def step_shapes_run(self) -> int:
        """Step shapes that have served at least one step (their first replay is behind them)."""
        return step_shapes_run(self._runner)

    @property
    def num_running(self) -> int:
        """Requests in the runner's running batch (read from any thread: a snapshot)."""
        return int(getattr(self._runner, "num_running", 0))

    @property
    def num_waiting(self) -> int:
        return int(getattr(self._runner, "num_waiting", 0))

    def generate(self, prompts, sampling_params=None, **params) -> "Completion | list":
        """Completions for a prompt (a `Completion`) or a list of prompts (a list, in order; n > 1: n per prompt).

        A prompt is a string, token ids, or chat messages `[{"role": ..., "content": ...}]`. sampling_params: a
        `specdec.SamplingParams`, or one per prompt (vLLM's shapes, `text/shapes.py`); else keywords: max_new_tokens
        (or max_tokens), n, temperature, the sampling filters (`core.FILTERS`: top_k, top_p, min_p, …), seed, stop,
        num_draft_tokens, logprobs, the logits processors (repetition_penalty, ..., constraint: a
        `specdec.constrain.Constraint`, compiled here for this model, or a compiled one), leniency (l < 1: lossy,
        appendix A.5), draft_tree ([k_1, ..., k_D]: verify a token tree per step; a draft model drafts it)."""
        batch, single = encode_prompts(prompts, self.tokenizer, self.vocab_size)
        batch, keywords, n = request_params(batch, sampling_params, params)
        prepared = [make_params(self, len(ids), kw) for ids, kw in zip(batch, keywords)]
        outputs: queue.Queue = queue.Queue()
        requests = []
        try:
            for i, (ids, (sampling, stop, gamma)) in enumerate(zip(batch, prepared)):
                sink = (lambda i: lambda item: outputs.put((i, item)))(i)
                requests.append(self.submit(ids, sampling, stop, gamma, sink))
            pending = len(requests)
            while pending:
                i, item = outputs.get()
                if isinstance(item, BaseException):
                    raise item
                request = requests[i]
                request.feed(item)
                if item.finished:
                    pending -= 1
                elif request.stop_reached:
                    self.abort(request.request_id)
        except BaseException:
            for request in requests:
                if not request.finished:
                    self.abort(request.request_id)
            raise
        return shape_outputs([r.completion() for r in requests], single, n)

    def chat(self, messages, sampling_params=None, **params) -> "Completion | list":
        """`generate` for one conversation (or a list of them), rendered with the chat template (vLLM's `chat`)."""
        return self.generate(check_conversations(messages), sampling_params, **params)

    def stream(self, prompt, sampling_params=None, **params) -> "TextStream":
        """Text deltas for one prompt (valid UTF-8; they concatenate to `.completion.text`)."""
        ids, sampling, stop, gamma = self.prepare(prompt, sampling_params, **params)
        return TextStream(self, ids, sampling, stop, gamma)

    def render_chat(self, messages) -> str:
        return render_chat(self.tokenizer, messages)

    def close(self) -> None:
        self.driver.close()
        if self.tensor_parallel is not None and self.tensor_parallel.is_leader:
            from specdec.text.tensor_parallel import stop_followers

            stop_followers(self)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TextStream:
    """Iterate for `str` deltas (or `.deltas()` for `TextDelta`s); `.completion` once exhausted."""

    def __init__(self, llm: LLM, ids, sampling, stop, gamma):
        self._llm = llm
        self._args = (ids, sampling, stop, gamma)
        self._request: TextRequest | None = None

    def __iter__(self) -> Iterator[str]:
        for delta in self.deltas():
            if delta.text:
                yield delta.text

    def deltas(self) -> Iterator[TextDelta]:
        if self._request is not None:
            raise RuntimeError("a TextStream can be iterated once")
        outputs: queue.Queue = queue.Queue()
        self._request = request = self._llm.submit(*self._args, outputs.put)
        try:
            while not request.finished:
                item = outputs.get()
                if isinstance(item, BaseException):
                    raise item
                delta = request.feed(item)
                if request.stop_reached and not item.finished:
                    self._llm.abort(request.request_id)
                if delta.text or delta.finish_reason or delta.pieces:
                    yield delta
        finally:
            if not request.finished:  # the consumer stopped early (break, exception, garbage collection)
                self._llm.abort(request.request_id)

    @property
    def completion(self) -> Completion:
        if self._request is None or not self._request.finished:
            raise RuntimeError("the stream has not finished yet: iterate over it first")
        return self._request.completion()
