"""A sampling filter is one `core.FILTERS` entry: the runners read it from there (`standardize_logits`,
`standardize_rows`, the engine's per-slot tensors), and so do the text API (`text.prompts.PARAMS`, a model's
generation_config defaults) and the server's mapping (`server.choices`). What stays by hand is each edge's typed
field: `SamplingParams`, `specdec.generate` / `stream`'s keywords and the OpenAI request models. This checks every
filter reaches every edge (ARCHITECTURE.md, "Adding a sampling parameter")."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest

import specdec
from specdec.core import FILTERS, SamplingConfig
from specdec.request import SamplingParams
from specdec.text.prompts import PARAMS, GenerationDefaults, make_params

NAMES = [f.name for f in FILTERS]


def missing_edges(names: list[str]) -> list[str]:
    """"edge: name" for each filter name an edge does not take."""
    edges = {
        "SamplingConfig": {f.name for f in dataclasses.fields(SamplingConfig)},
        "SamplingParams": {f.name for f in dataclasses.fields(SamplingParams)},
        "specdec.generate": set(inspect.signature(specdec.generate).parameters),
        "specdec.stream": set(inspect.signature(specdec.stream).parameters),
        "text.prompts.PARAMS": set(PARAMS),
        "GenerationDefaults": {name for name, _ in GenerationDefaults().filters},
    }
    try:
        from specdec.server.schema import ChatRequest, CompletionRequest
    except ImportError:  # the server extra is not installed
        pass
    else:
        edges["CompletionRequest"] = set(CompletionRequest.model_fields)
        edges["ChatRequest"] = set(ChatRequest.model_fields)
    return [f"{edge}: {name}" for edge, taken in edges.items() for name in names if name not in taken]


def test_every_filter_reaches_every_edge():
    assert {"top_k", "top_p", "min_p"} <= set(NAMES)
    assert missing_edges(NAMES) == []


def test_the_edge_check_reports_a_filter_an_edge_lacks():
    """Negative control: a made-up filter name is missing at every edge."""
    missing = missing_edges(["top_a"])
    assert {m.split(":")[0] for m in missing} >= {"SamplingConfig", "SamplingParams", "specdec.generate",
                                                   "specdec.stream", "text.prompts.PARAMS", "GenerationDefaults"}


def test_a_generation_configs_filters_are_the_text_apis_defaults():
    config = SimpleNamespace(do_sample=True, temperature=0.7, top_k=20, top_p=None, min_p=0.05)
    defaults = GenerationDefaults.from_model(SimpleNamespace(generation_config=config), [2])
    assert defaults.top_k == 20 and defaults.top_p == 1.0 and defaults.min_p == 0.05  # None → off
    with pytest.raises(AttributeError, match="no attribute 'top_a'"):
        defaults.top_a
    llm = SimpleNamespace(defaults=defaults, max_seq_len=64, num_draft_tokens=2)
    params, _, _ = make_params(llm, 4, {"max_new_tokens": 4})
    assert (params.top_k, params.top_p, params.min_p) == (20, 1.0, 0.05) and params.sampling.filters == (
        "top_k", "min_p")
    params, _, _ = make_params(llm, 4, {"max_new_tokens": 4, "min_p": 0.0, "top_p": 0.9})  # explicit wins
    assert params.sampling.filters == ("top_k", "top_p")
    with pytest.raises(ValueError, match="min_p must be in"):
        make_params(llm, 4, {"min_p": 2.0})


def test_the_server_maps_every_filter_field():
    pytest.importorskip("pydantic")
    from specdec.server.choices import build
    from specdec.server.protocol import CompletionRequest

    llm = SimpleNamespace(max_seq_len=64, vocab_size=100, num_draft_tokens=2,
                          defaults=SimpleNamespace(eos_token_ids=(2,)))
    request = CompletionRequest.model_validate({"prompt": "x", "top_k": -1, "top_p": 0.5, "min_p": 0.1})
    params = build(request, llm, [[5, 6]], 32, None).choices[0].params
    assert (params["top_k"], params["top_p"], params["min_p"]) == (0, 0.5, 0.1)  # vLLM's top_k -1 = off
    assert {"top_k", "top_p", "min_p"}.isdisjoint(build(CompletionRequest.model_validate({"prompt": "x"}), llm,
                                                         [[5]], 32, None).choices[0].params)
