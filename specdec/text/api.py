"""`specdec.load(...)`: text in, text out, over the request-level engine (or the eager loop where it cannot run).

    llm = specdec.load("path/to/target", draft="path/to/draft")      # or "prompt-lookup", "ngram"
    llm.generate("def fib(n):", max_new_tokens=64).text
    for delta in llm.stream([{"role": "user", "content": "hi"}], temperature=0.7, seed=0):
        print(delta, end="")

Defaults come from the target's generation_config (greedy unless do_sample), explicit arguments win.
Requests run on one background thread (`Driver`); `generate`/`stream` block only the calling thread.
"""

from __future__ import annotations

import gc
import itertools
import logging
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from specdec.engine.config import BATCH_BUCKETS
from specdec.request import as_int, resolve_eos
from specdec.text.driver import Driver
from specdec.text.drafts import load_draft
from specdec.text.outputs import Completion, TextDelta, TextRequest
from specdec.text.prompts import (GenerationDefaults, check_num_draft_tokens, encode_prompts, make_params,
                                  read_chat_template, render_chat)
from specdec.text.runner import FallbackRunner
from specdec.text.warmup import MAX_WARMUP_SHAPES, graph_captures, step_shapes, step_shapes_run, warm_up

logger = logging.getLogger(__name__)

__all__ = ["load", "LLM", "TextStream"]

RUNNERS = ("auto", "engine", "fallback")
#: distinct num_draft_tokens values served at once (each runner holds its own KV cache)
MAX_RUNNERS = 4


def load(target, draft=None, *, tokenizer=None, device="auto", dtype="auto", num_draft_tokens=4,
         chat_template: str | None = None, allow_pickle: bool = False, runner: str = "auto",
         max_batch_size: int = 32, max_seq_len: int | None = None, ngram_data=None,
         synthetic_acceptance: float | None = None, tensor_parallel_size: int = 1, model_kwargs: dict | None = None,
         draft_model_kwargs: dict | None = None, allow_weight_mismatch: bool = False,
         tensor_parallel_all_reduce: str = "auto", bitwise: bool = False,
         prefill_budget: int | str | None = None, prefill_steps: int | None = None,
         prefill_stall: float | None = None) -> "LLM":
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
    num_draft_tokens default γ (an int, or a policy name on the fallback runner); 0 = plain decoding
    chat_template   a Jinja chat template (string or file) replacing the tokenizer's own
    allow_pickle    load .bin/.pt weights (pickle can run code); safetensors only by default
    runner          "auto": the request-level engine when it covers the model, else the eager loop;
                    "engine" / "fallback" to force one
    synthetic_acceptance  BENCHMARK ONLY (the engine's `EngineConfig.synthetic_acceptance`): each draft is
                    accepted with this probability, so a random pair serves at a known α; the output is then
                    NOT the target's distribution
    tensor_parallel_size  N > 1: run under `torchrun --nproc-per-node N`; every rank loads its shard of the
                    target folder; rank 0 gets the LLM, the other ranks follow its steps and exit the process
                    when rank 0 closes it (`specdec/text/tensor_parallel.py`); γ must be a fixed integer
    bitwise         bit-for-bit exact mode (the engine's `EngineConfig.bitwise`): greedy and seeded output and
                    log-probabilities are the same bits alone or in any batch, for any γ, drafter, speculation on or
                    off; needs the engine (refused on the fallback runner and with tensor parallelism); slower
    prefill_budget  the engine's chunked prefill (`EngineConfig.prefill_budget`): prompt tokens prefilled per step
                    while requests run; None / 0 = off (admitted prompts prefill whole), the default; "auto": sized
                    from the measured decode step (`prefill_stall` of it); `prefill_steps` K: each request fed
                    within K steps (`EngineConfig.prefill_steps`, `EngineConfig.prefill_stall`)
    tensor_parallel_all_reduce  how the ranks sum the row-parallel products: "auto" (one_shot where the GPUs
                    reach each other by P2P, else group), "group" (NCCL / gloo) or "one_shot" (torch symmetric
                    memory over NVLink, CUDA); see `specdec.distributed.allreduce`
    """
    from specdec.loading import load_model, load_tokenizer, source_options

    from specdec.drafters.protocol import check_drafter_argument

    check_drafter_argument(draft, "draft")  # (its kind, before anything loads)
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    tensor_parallel_size = as_int(tensor_parallel_size, "tensor_parallel_size", minimum=1, maximum=1024)
    from specdec.distributed.allreduce import check_all_reduce

    if check_all_reduce(tensor_parallel_all_reduce) != "auto" and tensor_parallel_size == 1:
        raise ValueError(f"tensor_parallel_all_reduce={tensor_parallel_all_reduce!r} needs tensor_parallel_size > 1")
    if not isinstance(bitwise, bool):
        raise TypeError(f"bitwise must be True or False, got {bitwise!r}")
    from specdec.engine.config import EngineConfig

    EngineConfig(prefill_budget=prefill_budget, prefill_steps=prefill_steps,
                 prefill_stall=prefill_stall)  # (checked before anything loads)
    if bitwise and (runner == "fallback" or tensor_parallel_size > 1):
        raise ValueError("bitwise=True needs the request-level engine on one device (not runner='fallback', not "
                         "tensor_parallel_size > 1)")
    if tensor_parallel_size > 1:
        if model_kwargs is not None or allow_weight_mismatch:
            raise ValueError("tensor_parallel_size > 1 reads a safetensors folder per rank: model_kwargs and "
                             "allow_weight_mismatch are not supported with it")
        from specdec.text.tensor_parallel import check_gamma, load_tensor_parallel

        check_gamma(check_num_draft_tokens(num_draft_tokens))

        def make_llm(model, channel):
            tok = tokenizer if tokenizer is not None else target
            tok = load_tokenizer(tok) if isinstance(tok, (str, Path)) else tok
            if chat_template is not None:
                tok.chat_template = read_chat_template(chat_template)
            drafter = load_draft(draft, model, tok, allow_pickle, ngram_data, draft_model_kwargs=draft_model_kwargs)
            return LLM(model, tok, drafter, num_draft_tokens=num_draft_tokens, runner=runner,
                       max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                       synthetic_acceptance=synthetic_acceptance, tensor_parallel=channel)

        return load_tensor_parallel(target, tensor_parallel_size, device=device, dtype=dtype, make_llm=make_llm,
                                    all_reduce=tensor_parallel_all_reduce)
    tokenizer_kwargs = None
    if isinstance(target, (str, Path)):
        if tokenizer is None:  # the target's own: same revision / gguf_file / subfolder
            tokenizer, tokenizer_kwargs = target, model_kwargs
    else:
        if model_kwargs is not None:
            raise ValueError("model_kwargs apply when target is a path or hub id, not a model object")
        if tokenizer is None:
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
    return LLM(target_model, tokenizer, drafter, num_draft_tokens=num_draft_tokens, runner=runner,
               max_batch_size=max_batch_size, max_seq_len=max_seq_len, synthetic_acceptance=synthetic_acceptance,
               bitwise=bitwise, prefill_budget=prefill_budget, prefill_steps=prefill_steps,
               prefill_stall=prefill_stall)


class LLM:
    """A target (+ drafter) and its tokenizer, serving text requests through runners on a background thread."""

    def __init__(self, target, tokenizer, drafter=None, *, num_draft_tokens=4, runner: str = "auto",
                 max_batch_size: int = 32, max_seq_len: int | None = None,
                 synthetic_acceptance: float | None = None, tensor_parallel=None, bitwise: bool = False,
                 prefill_budget: int | str | None = None, prefill_steps: int | None = None,
                 prefill_stall: float | None = None):
        self.target = target
        self.tensor_parallel = tensor_parallel  # a CommandChannel under torchrun (text/tensor_parallel.py), or None
        self._tensor_parallel_started = False
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.runner_choice = runner
        self.max_batch_size = as_int(max_batch_size, "max_batch_size", minimum=1, maximum=4096)
        self._max_seq_len = max_seq_len
        self.synthetic_acceptance = synthetic_acceptance  # BENCHMARK ONLY (see `load`)
        self.bitwise = bitwise  # the engine's bit-exact mode (see `load`)
        self.prefill_budget, self.prefill_steps = prefill_budget, prefill_steps  # the engine's chunked prefill
        self.prefill_stall = prefill_stall
        self.num_draft_tokens = check_num_draft_tokens(num_draft_tokens if drafter is not None else 0)
        if drafter is not None and self.num_draft_tokens == 0:
            raise ValueError("num_draft_tokens must be >= 1 when a draft is given (requests may still ask for "
                             "num_draft_tokens=0, plain decoding)")
        # an encoder-decoder's prompt is the encoder's input, not text its output continues
        self._continues_prompt = not getattr(getattr(target, "config", None), "is_encoder_decoder", False)
        eos = resolve_eos(None, target) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self.defaults = GenerationDefaults.from_model(target, eos)
        self.driver = Driver()
        self._runners: dict = {}
        self.warmups: dict = {}  # γ → the start-up capture's report (`text.warmup.warm_up`), CUDA runners only
        self._runner_lock = threading.Lock()
        self._ids = itertools.count()
        first = self.runner(self.num_draft_tokens)  # fails now (not at the first request) on a bad setup
        self.runner_kind = "fallback" if isinstance(first, FallbackRunner) else "engine"
        self.vocab_size = int(first.vocab_size)
        self.max_seq_len = int(first.max_seq_len)
        self._tensor_parallel_started = True  # runners made from now on are made on every rank by command

    # --- runners ------------------------------------------------------------------------------------
    def runner(self, num_draft_tokens):
        """The runner serving requests at this γ (created on first use; 0 = plain decoding)."""
        key = check_num_draft_tokens(num_draft_tokens)
        if key != 0 and self.drafter is None:
            raise ValueError(f"num_draft_tokens={key!r} needs a draft model; this model was loaded without one")
        with self._runner_lock:
            current = self._runners.get(key)
            if current is not None and current not in self.driver.failed:
                return current
            if current is None and len(self._runners) >= MAX_RUNNERS:
                raise ValueError(f"num_draft_tokens: at most {MAX_RUNNERS} distinct values are served at once, "
                                 f"already serving {sorted(map(str, self._runners))}")
            self._runners[key] = made = self._make_runner(key)
            if gc.get_freeze_count():  # the process froze its start-up heap (`specdec serve`): a runner built
                gc.freeze()  # later (plain requests' γ = 0) joins it, or each full collection walks its objects
            return made

    def _make_runner(self, gamma):
        if self.tensor_parallel is not None:
            from specdec.text.tensor_parallel import make_runner

            return make_runner(self, gamma, announce=self._tensor_parallel_started)
        return self._build_runner(gamma)

    def _build_runner(self, gamma):
        """The request-level engine when it covers the model (falling back only on `UnsupportedModel`)."""
        drafter = self.drafter if gamma != 0 else None
        if self.runner_choice != "fallback":
            from specdec.engine import Engine, EngineConfig, UnsupportedModel

            if isinstance(gamma, str) and gamma != "auto":
                raise ValueError(f"num_draft_tokens={gamma!r}: the engine takes an int or 'auto' "
                                 "(policy names run on runner='fallback')")
            config = EngineConfig(max_batch_size=min(self.max_batch_size, BATCH_BUCKETS[-1]),
                                  max_seq_len=self._max_seq_len, num_draft_tokens=gamma,
                                  max_draft_tokens=max(8, gamma if isinstance(gamma, int) else 0),
                                  synthetic_acceptance=self.synthetic_acceptance, bitwise=self.bitwise,
                                  prefill_budget=self.prefill_budget, prefill_steps=self.prefill_steps,
                                  prefill_stall=self.prefill_stall)
            try:
                engine = Engine(self.target, drafter, config=config)
            except UnsupportedModel as err:
                if self.runner_choice == "engine" or self.bitwise:
                    raise
                from specdec.engine.build import notice_fallback

                notice_fallback(str(err))
            else:
                if engine.cuda_graphs:  # capture every decode shape now, not while serving (as vLLM does)
                    report = self.warmups[gamma] = warm_up(engine, engine.max_batch)
                    logger.info("num_draft_tokens=%s: captured %d decode step shapes in %.1f s (batch sizes %s, γ %s, "
                                "%d length buckets%s)", gamma, report["shapes"], report["seconds"],
                                report["batch_sizes"], report["gammas"], report["length_buckets"],
                                "" if report["complete"] else f" up to {report['max_length']} tokens: longer requests "
                                f"capture on first use (bound: {MAX_WARMUP_SHAPES} shapes)")
                return engine
        if self.bitwise:
            raise ValueError("bitwise=True needs the request-level engine (runner='engine')")
        if self.synthetic_acceptance is not None:
            raise ValueError("synthetic_acceptance needs the request-level engine (runner='engine'); this model "
                             "runs on the fallback runner")
        policy = "guarded" if gamma == "auto" else gamma if gamma != 0 else 1  # the loop's nearest to "auto"
        return FallbackRunner(self.target, drafter, num_draft_tokens=policy, max_batch_size=self.max_batch_size,
                              max_seq_len=self._max_seq_len)

    # --- requests -------------------------------------------------------------------------------------
    def prepare(self, prompt, **params):
        """(prompt_ids, SamplingParams, stop strings, γ) for one prompt, every argument checked."""
        batch, single = encode_prompts(prompt, self.tokenizer, self.vocab_size)
        if not single:
            raise ValueError(f"prompt must be one prompt (a string, token ids or chat messages), got {len(batch)}")
        ids = batch[0]
        sampling, stop, gamma = make_params(self, len(ids), params)
        return ids, sampling, stop, gamma

    def submit(self, prompt_ids, sampling, stop, gamma, sink, request_id: str | None = None) -> TextRequest:
        """Start a request; `sink` gets its RequestOutputs (then maybe an Exception) on the driver thread."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        request = TextRequest(rid, self.tokenizer, prompt_ids, stop, logprobs=sampling.logprobs,
                              decode_context=prompt_ids if self._continues_prompt else (),
                              min_tokens=sampling.min_tokens)
        self.driver.submit(self.runner(gamma), prompt_ids, sampling, sink, rid)
        return request

    def abort(self, request_id: str) -> None:
        self.driver.abort(request_id)

    def runner_key(self, runner):
        """The num_draft_tokens value `runner` serves (None for a runner this model does not hold)."""
        return next((k for k, r in list(self._runners.items()) if r is runner), None)

    @property
    def graph_captures(self) -> int:
        """CUDA graph pairs captured by the runners so far (start-up warm-up included; 0 on CPU)."""
        return sum(graph_captures(r) for r in list(self._runners.values()))

    @property
    def step_shapes(self) -> int:
        """Distinct decode step shapes the runners have built (eager or captured)."""
        return sum(step_shapes(r) for r in list(self._runners.values()))

    @property
    def step_shapes_run(self) -> int:
        """Step shapes that have served at least one step (their first replay is behind them)."""
        return sum(step_shapes_run(r) for r in list(self._runners.values()))

    @property
    def num_running(self) -> int:
        """Requests in the runners' running batches (read from any thread: a snapshot)."""
        return sum(int(getattr(r, "num_running", 0)) for r in list(self._runners.values()))

    @property
    def num_waiting(self) -> int:
        return sum(int(getattr(r, "num_waiting", 0)) for r in list(self._runners.values()))

    def generate(self, prompts, **params) -> "Completion | list[Completion]":
        """Completions for a prompt (a `Completion`) or a list of prompts (a list, in order).

        A prompt is a string, token ids, or chat messages `[{"role": ..., "content": ...}]`.
        params: max_new_tokens, temperature, the sampling filters (`core.FILTERS`: top_k, top_p, min_p, …), seed,
        stop, num_draft_tokens, logprobs, the logits
        processors (repetition_penalty, ..., constraint: a `specdec.constrain.Constraint`, compiled here for this
        model, e.g. `Constraint.json_schema(schema)`, or a compiled one), leniency (l < 1: lossy, appendix A.5),
        draft_tree ([k_1, ..., k_D]: verify a token tree per step; a draft model drafts it).
        """
        batch, single = encode_prompts(prompts, self.tokenizer, self.vocab_size)
        prepared = [make_params(self, len(ids), params) for ids in batch]
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
        completions = [r.completion() for r in requests]
        return completions[0] if single else completions

    def stream(self, prompt, **params) -> "TextStream":
        """Text deltas for one prompt (valid UTF-8; they concatenate to `.completion.text`)."""
        ids, sampling, stop, gamma = self.prepare(prompt, **params)
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
