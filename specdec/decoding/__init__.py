"""The front door: `generate` / `stream` (keyword arguments → one `SamplingParams`) and `stream_request`, which
picks the runner for a call (`route.py`) — the request-level engine (`specdec.engine`, its token trees included) by
default on every device, or the eager loop (`loop.chain`, `loop.tree_decoding`) for what the engine does not take;
`beam_search` likewise picks transformers' forward passes (`search.beam`) or the engine's beam groups
(`engine.beam_run`); `stops.py` cuts `stop_strings`. It imports both runners (the engine lazily); neither runner
imports the other or this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from specdec.core import FILTERS
from specdec.drafters.protocol import check_drafter_argument
from specdec.loop.chain import run_chain
from specdec.policy import DraftLengthPolicy
from specdec.request import SamplingParams, resolve_eos
from specdec.decoding.route import engine_or_none, engine_tree_drafter, is_feature_head, use_engine
from specdec.decoding.stops import StopCut
from specdec.step import GenerateResult, GenerationStream, TokenEvent

__all__ = ["generate", "stream", "stream_request", "beam_search", "GenerateResult", "TokenEvent", "GenerationStream"]


def generate(
    target,
    prompts=None,
    drafter=None,
    max_new_tokens: int = 64,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: "int | str | DraftLengthPolicy" = 4,
    eos_token_id: "int | Sequence[int] | None" = None,
    seed: int | None = None,
    *,
    input_ids=None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    on_tokens: Callable[[TokenEvent], None] | None = None,
    streamer=None,
    stop_strings: "str | Sequence[str] | None" = None,
    tokenizer=None,
    engine: str = "auto",
    leniency: float = 1.0,
    draft_tree: "Sequence[int] | None" = None,
    min_p: float | None = None,
    **processors,
) -> GenerateResult:
    """Generate up to `max_new_tokens` per prompt with speculative decoding (plain decoding if drafter=None).

        specdec.generate(model, **tokenizer(text, return_tensors="pt"), drafter=draft, max_new_tokens=64)

    target          a transformers PreTrainedModel (decoder-only or encoder-decoder) or a specdec target
    prompts         list[list[int]] (ragged) or LongTensor [B, T] (with `attention_mask` [B, T] for padding); or
                    pass `input_ids=` (+ `attention_mask=`), as `**tokenizer(...)` does
    drafter         None | transformers model | `NGramDrafter` | `PromptLookupDrafter` | any `Drafter`
    temperature     0 = greedy (exact argmax path); top_k 0, top_p 1.0 and min_p 0.0 = off (after temperature, in
                    that order, to p and q alike: transformers' TopK/TopP/MinPLogitsWarper). None (the default):
                    the target's generation_config, as transformers reads it — greedy unless `do_sample`, else its
                    temperature and filters (a filter it leaves unset is off, as in vLLM: transformers' global
                    top_k=50 is not applied)
    streamer        a transformers streamer (`TextStreamer`, `TextIteratorStreamer`: `put(ids)` / `end()`); one
                    prompt, as transformers allows; it gets the prompt, then each step's tokens
    stop_strings    a string or list: a row's output ends after the first stop string its text contains (kept, as
                    transformers keeps it); needs `tokenizer=`. The runner decodes to EOS or the budget, the result
                    and the streamer are cut (`stats` count the tokens decoded)
    num_draft_tokens γ: an int, a policy name ("heuristic", "optimal", ...) or a `DraftLengthPolicy`
    eos_token_id    int or list; None = the target's generation_config / config EOS (as in transformers)
    seed            int → reproducible; otherwise pass `generator` or get fresh OS randomness
    on_tokens       called with a `TokenEvent` after every step (streaming)
    engine          "auto" (the default, on every device): the request-level engine (`specdec.engine`) — a fast
                    family body (`specdec.fast.families`) where one covers the model, else the engine's transformers
                    backend (the model's own modules; one log line), draft-length policies included — and the eager
                    transformers loop only for what the engine refuses or would run slower (`decoding/route.py`: a
                    loop-only drafter holding a model, models neither body runs: one log line); "fast": the engine
                    (an error where it refuses);
                    "hf": the eager loop over the transformers model
    leniency        l ∈ (0, 1]: 1 = exact; l < 1 accepts more drafts and is LOSSY (appendix A.5, `core.verify`)
    draft_tree      [k_1, ..., k_D]: verify a token tree per step instead of a chain (`specdec.loop.tree_decoding`)
    processors      logits processors, keyword arguments of `SamplingParams`: repetition_penalty,
                    frequency_penalty, presence_penalty, logit_bias, min_tokens, constraint (`core.processors`;
                    applied to p and q at every drafted position, so the law is exactly the processed target's)
    """
    if on_tokens is not None and not callable(on_tokens):
        raise TypeError(f"on_tokens must be None or a callable taking a TokenEvent, got {type(on_tokens).__name__}")
    prompts, attention_mask = _prompt_inputs(prompts, input_ids, attention_mask)
    stop_texts = StopCut.check(stop_strings, tokenizer)
    if streamer is not None and not all(callable(getattr(streamer, m, None)) for m in ("put", "end")):
        raise TypeError(f"streamer must have put(ids) and end() (a transformers streamer), got "
                        f"{type(streamer).__name__}")
    run = stream(  # every argument checked here (the prompts included), nothing run yet
        target, prompts, drafter, max_new_tokens, temperature, top_k, top_p, num_draft_tokens, eos_token_id, seed,
        generator=generator, attention_mask=attention_mask, engine=engine, leniency=leniency, draft_tree=draft_tree,
        min_p=min_p, **processors,
    )
    stops = StopCut(stop_texts, tokenizer, _num_rows(prompts)) if stop_texts else None
    if streamer is not None and _num_rows(prompts) != 1:
        raise ValueError(f"streamer= takes one prompt (as transformers' streamers do), got {_num_rows(prompts)}")
    if streamer is not None:
        streamer.put(_prompt_tensor(prompts, attention_mask))
    for event in run:
        shown = stops.feed(event) if stops is not None else event
        if streamer is not None and shown.rows:
            streamer.put(torch.tensor(shown.tokens[0], dtype=torch.long))
        if on_tokens is not None:
            on_tokens(event)
    if streamer is not None:
        streamer.end()
    result = run.result
    return result if stops is None else GenerateResult(stops.cut(result.sequences), result.stats)


def stream(
    target,
    prompts=None,
    drafter=None,
    max_new_tokens: int = 64,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: "int | str | DraftLengthPolicy" = 4,
    eos_token_id: "int | Sequence[int] | None" = None,
    seed: int | None = None,
    *,
    input_ids=None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    engine: str = "auto",
    leniency: float = 1.0,
    draft_tree: "Sequence[int] | None" = None,
    min_p: float | None = None,
    **processors,
) -> GenerationStream:
    """Like `generate`, but returns a `GenerationStream` of per-step `TokenEvent`s (arguments validated now).
    Sampling defaults (None) come from the target's generation_config, as in `generate`."""
    unknown = sorted(set(processors) - set(_PROCESSOR_ARGUMENTS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}; logits processors: "
                        f"{', '.join(_PROCESSOR_ARGUMENTS)}")
    prompts, attention_mask = _prompt_inputs(prompts, input_ids, attention_mask)
    eos = tuple(resolve_eos(eos_token_id, target))
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    sampling = {k: v for k, v in given.items() if v is not None}
    if len(sampling) < len(given):
        sampling = {**sampling_defaults(target), **sampling}
    params = SamplingParams(max_new_tokens=max_new_tokens, seed=seed, eos_token_ids=eos, leniency=leniency,
                            **sampling, **processors)  # the edge: one request description
    return stream_request(target, prompts, drafter, params, num_draft_tokens, generator=generator,
                          attention_mask=attention_mask, engine=engine, draft_tree=draft_tree)


def sampling_defaults(target) -> dict:
    """temperature, top_k, top_p, min_p from the target's generation_config as transformers reads it: greedy
    (temperature 0) unless `do_sample`; then its temperature (else 1.0) and each filter it sets (else off).
    A target without a generation_config (a specdec `Target`) decodes greedily, as transformers' default."""
    model = target if isinstance(target, torch.nn.Module) else getattr(target, "model", target)
    config = getattr(model, "generation_config", None)

    def get(name, default):
        value = getattr(config, name, None) if config is not None else None
        return default if value is None else value

    if not get("do_sample", False):
        return {"temperature": 0.0}
    return {"temperature": float(get("temperature", 1.0)), **{f.name: get(f.name, f.off) for f in FILTERS}}


_PROCESSOR_ARGUMENTS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens",
                        "allowed_token_ids", "no_repeat_ngram_size", "bad_words_ids",
                        "constraint")


def stream_request(
    target,
    prompts,
    drafter,
    params: SamplingParams,
    num_draft_tokens: "int | str | DraftLengthPolicy" = 4,
    *,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    engine: str = "auto",
    draft_tree: "Sequence[int] | None" = None,
) -> GenerationStream:
    """`stream` for prompts described by one `SamplingParams` (what `stream` builds from its keyword arguments;
    `eos_token_ids` are used as given: () = none). Picks the runner: token trees, the engine or the loop."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    check_drafter_argument(drafter, "drafter")  # (its kind, before any runner starts)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if params.logprobs:
        raise ValueError("logprobs: specdec.generate / stream return no log-probabilities; "
                         "use specdec.load(...).generate(..., logprobs=True)")
    lenient = params.leniency != 1.0
    draft_tree = draft_tree if draft_tree is not None else params.draft_tree  # (SamplingParams may carry it)
    if params.processors and draft_tree is not None:
        raise ValueError(f"{', '.join(params.processors)}: logits processors run on chains (the transformers loop "
                         "and the engine), not on draft_tree")
    if lenient and draft_tree is not None:
        raise ValueError("leniency is not supported with draft_tree: token trees verify exactly (leniency=1.0)")
    if is_feature_head(drafter) and (engine == "hf" or draft_tree is not None):
        from specdec.engine.config import UnsupportedModel

        raise UnsupportedModel("drafter: a feature head reads the target's hidden states, which only the engine "
                               "keeps: use engine='fast' (or 'auto'), without draft_tree")
    if draft_tree is not None:  # token trees: on the engine a draft model drafts them (a `TreeModelDrafter`'s too)
        tree_params = replace(params, draft_tree=tuple(draft_tree))
        model = engine_tree_drafter(drafter)
        if engine == "fast" or isinstance(model, torch.nn.Module) and use_engine(engine, target, model,
                                                                                 num_draft_tokens):
            run = engine_or_none(engine, target, prompts, model, tree_params, num_draft_tokens, generator,
                                 attention_mask)
            if run is not None:
                return run
        from specdec.loop.tree_decoding import run_tree

        return run_tree(target, prompts, drafter, draft_tree, params, generator=generator,
                        attention_mask=attention_mask)
    if use_engine(engine, target, drafter, num_draft_tokens):
        run = engine_or_none(engine, target, prompts, drafter, params, num_draft_tokens, generator, attention_mask)
        if run is not None:
            return run
    return run_chain(target, prompts, drafter, params, num_draft_tokens, generator=generator,
                     attention_mask=attention_mask)


def _prompt_inputs(prompts, input_ids, attention_mask):
    """(prompts, attention_mask) from the positional prompts or `input_ids=` (`**tokenizer(...)`: lists or
    tensors [B, T]); refused when both or neither are given."""
    if input_ids is not None:
        if prompts is not None:
            raise TypeError("give the prompts once: positionally or as input_ids=, not both")
        prompts = input_ids
        if attention_mask is not None and not isinstance(input_ids, torch.Tensor):
            try:
                prompts = torch.tensor(input_ids, dtype=torch.long)
            except (TypeError, ValueError) as err:
                raise ValueError(f"input_ids with an attention_mask must be rows of one length: {err}") from None
    if prompts is None:
        raise TypeError("generate() needs the prompts: token ids positionally, or input_ids= (**tokenizer(...))")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        try:
            attention_mask = torch.tensor(attention_mask, dtype=torch.long)
        except (TypeError, ValueError) as err:
            raise ValueError(f"attention_mask must be rows of 0/1 of one length: {err}") from None
    return prompts, attention_mask


def _num_rows(prompts) -> int:
    return int(prompts.shape[0]) if isinstance(prompts, torch.Tensor) and prompts.dim() == 2 else len(prompts)


def _prompt_tensor(prompts, attention_mask) -> torch.Tensor:
    """The one prompt as transformers hands it to a streamer first: LongTensor [1, T] (padding removed)."""
    row = prompts[0].tolist() if isinstance(prompts, torch.Tensor) else list(prompts[0])
    if attention_mask is not None:
        row = [t for t, keep in zip(row, attention_mask[0].tolist()) if keep]
    return torch.tensor([row], dtype=torch.long)


def beam_search(target, prompts, drafter=None, *, engine: str = "auto", **options):
    """Speculative beam search of width `num_beams` = w: the w beams of transformers'
    `generate(num_beams=w, do_sample=False)` per prompt, best first, with their scores (`BeamSearchResult`).

    Options (`search.beam.beam_search`): num_beams, draft_beams u ≥ w, num_draft_tokens γ, max_new_tokens,
    eos_token_id, length_penalty, early_stopping, attention_mask.
    engine   "hf": transformers' forward passes over transformers' own cache, the prompts batched (`search.beam`);
             "fast": inside the engine, one beam group of w slots per prompt (`engine.beam_run`), on whichever body
             the engine's build gives the model — a fast family body, else the transformers backend (OPT, Falcon,
             Mixtral, ...: the model's own modules over the engine's paged attention) —, `UnsupportedModel` where the
             engine refuses it (the build refuses the model or drafter; a target with sliding-window layers);
             "auto" (default): "fast" on every device, and "hf" where the engine refuses (one log line, kept on the
             model: `decoding.route.beams_or_none`)
    """
    if engine not in ("auto", "hf", "fast"):
        raise ValueError(f"engine must be 'auto', 'hf' or 'fast', got {engine!r}")
    if engine != "hf":
        from specdec.decoding.route import beams_or_none

        result = beams_or_none(engine, target, prompts, drafter, options)
        if result is not None:
            return result
    from specdec.search.beam import beam_search as loop_beam_search

    return loop_beam_search(target, prompts, drafter, **options)
