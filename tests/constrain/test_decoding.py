"""Constrained decoding on the transformers loop: speculative greedy text == plain constrained greedy text (and
== an independent reference: argmax over the masked logits, the matcher fed token by token), and it validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (pip install 'specdec[grammar]')")
transformers = pytest.importorskip("transformers")
pydantic = pytest.importorskip("pydantic")

import specdec  # noqa: E402
from specdec.constrain import Constraint, compile_constraint  # noqa: E402
from specdec.drafters import PromptLookupDrafter  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair"


class Person(pydantic.BaseModel):
    name: str
    age: int
    tags: list[str]


@pytest.fixture(scope="module")
def demo():
    tokenizer = transformers.AutoTokenizer.from_pretrained(DEMO / "target")
    target = transformers.AutoModelForCausalLM.from_pretrained(DEMO / "target", dtype=torch.float32).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(DEMO / "draft", dtype=torch.float32).eval()
    return tokenizer, target, draft


def _compile(tokenizer, target, constraint):
    return compile_constraint(constraint, tokenizer, target.get_output_embeddings().weight.shape[0],
                              [tokenizer.eos_token_id])


@torch.inference_mode()
def _reference(target, grammar, prompt, max_new_tokens):
    """Plain constrained greedy decoding, written out: full forward, mask from a matcher, argmax."""
    import xgrammar as xgr

    matcher = grammar.matcher()
    bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)
    ids, out = list(prompt), []
    for _ in range(max_new_tokens):
        logits = target(torch.tensor([ids])).logits[0, -1]
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits[None], bitmask)
        token = int(logits.argmax())
        assert matcher.accept_token(token)
        out.append(token)
        ids.append(token)
        if matcher.is_terminated():
            break
    return out


def _prompts(tokenizer):
    texts = ["A person as JSON: ", "def f(x):\n    return", "{\"name\": \"Ada\", \"age\": 36, \"tags\": [\"x\"]}\n"]
    return [tokenizer.encode(t) for t in texts]


@pytest.mark.parametrize("constraint", [
    Constraint.json_schema(Person.model_json_schema()),
    Constraint.json_object(),
    Constraint.regex(r"[0-9]{3}-[a-z]+ (yes|no)"),
    Constraint.choice(["positive", "negative", "neutral"]),
], ids=["json_schema", "json_object", "regex", "choice"])
def test_speculative_greedy_equals_plain_constrained_greedy(demo, constraint):
    tokenizer, target, draft = demo
    grammar = _compile(tokenizer, target, constraint)
    prompts = _prompts(tokenizer)
    plain = specdec.generate(target, prompts, None, max_new_tokens=40, temperature=0, constraint=grammar, engine="hf")
    for b, prompt in enumerate(prompts):
        assert plain.sequences[b] == _reference(target, grammar, prompt, 40), b
    for drafter, gamma in ((draft, 1), (draft, 4), (PromptLookupDrafter(), 3)):
        spec = specdec.generate(target, prompts, drafter, max_new_tokens=40, temperature=0, num_draft_tokens=gamma,
                                constraint=grammar, engine="hf")
        assert spec.sequences == plain.sequences, (type(drafter).__name__, gamma)
    for gamma in (0, 3):  # the engine (eager for constrained rows) gives the same text
        fast = specdec.generate(target, prompts, draft if gamma else None, max_new_tokens=40, temperature=0,
                                num_draft_tokens=gamma, constraint=grammar, engine="fast")
        assert fast.sequences == plain.sequences, ("engine", gamma)
    for tokens in plain.sequences:
        if tokens[-1] == tokenizer.eos_token_id:  # complete: it matches (else the budget cut it)
            text = tokenizer.decode(tokens[:-1])
            matcher = grammar.matcher()
            assert matcher.accept_string(text) and matcher.is_completed(), text
            if constraint.kind == "json_schema":
                Person.model_validate_json(text)


def test_a_complete_json_text_validates_and_ends_with_eos(demo):
    tokenizer, target, draft = demo
    grammar = _compile(tokenizer, target, Constraint.json_schema(Person.model_json_schema()))
    result = specdec.generate(target, [tokenizer.encode("Ada, 36, likes math: ")], draft, max_new_tokens=200,
                              temperature=0, num_draft_tokens=4, constraint=grammar, engine="hf")
    tokens = result.sequences[0]
    assert tokens[-1] == tokenizer.eos_token_id, tokenizer.decode(tokens)
    person = Person.model_validate_json(tokenizer.decode(tokens[:-1]))
    assert isinstance(person.age, int)
    assert result.stats.accepted_tokens > 0  # the masked drafter agrees with the masked target


def test_refusals_name_the_constraint(demo):
    tokenizer, target, draft = demo
    grammar = _compile(tokenizer, target, Constraint.json_object())
    prompt = [tokenizer.encode("x")]
    with pytest.raises(ValueError, match="constraint: .*logits processors run on"):
        specdec.generate(target, prompt, draft, constraint=grammar, draft_tree=[2, 1])
    with pytest.raises(ValueError, match="constraint: its text ends with token 2, which is not among"):
        specdec.generate(target, prompt, draft, constraint=grammar, eos_token_id=5)
    with pytest.raises(ValueError, match="min_tokens=3 cannot be combined with a constraint"):
        specdec.generate(target, prompt, draft, constraint=grammar, min_tokens=3)
    with pytest.raises(TypeError, match="constraint must be None or a ConstraintSpec"):
        specdec.generate(target, prompt, draft, constraint=Constraint.json_object())
    other = compile_constraint(Constraint.json_object(), tokenizer, 9000, [tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="grammar: compiled for 9000 logits but the model has"):
        specdec.generate(target, prompt, draft, constraint=other, engine="hf")
