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
    plain = specdec.generate(target, prompts, None, max_new_tokens=32, temperature=0, constraint=grammar, engine="hf")
    for b, prompt in enumerate(prompts):
        assert plain.sequences[b] == _reference(target, grammar, prompt, 32), b
    for drafter, gamma in ((draft, 4), (PromptLookupDrafter(), 3)):
        spec = specdec.generate(target, prompts, drafter, max_new_tokens=32, temperature=0, num_draft_tokens=gamma,
                                constraint=grammar, engine="hf")
        assert spec.sequences == plain.sequences, (type(drafter).__name__, gamma)
    for gamma in (0, 3):  # the engine (eager for constrained rows) gives the same text
        fast = specdec.generate(target, prompts, draft if gamma else None, max_new_tokens=32, temperature=0,
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_constrained_rows_beside_graph_rows_on_cuda(demo):
    """On CUDA the engine captures graphs for plain rows and runs a step with a constrained row eagerly: in one
    batch, the constrained rows give the CPU loop's constrained greedy text and the others their own (a difference
    must be a float tie among the allowed tokens)."""
    from specdec.engine import Engine, EngineConfig
    from specdec.request import SamplingParams

    tokenizer, target, draft = demo
    grammar = _compile(tokenizer, target, Constraint.json_schema(Person.model_json_schema()))
    prompts = _prompts(tokenizer)
    cpu = specdec.generate(target, prompts, draft, max_new_tokens=32, temperature=0, num_draft_tokens=4,
                           constraint=grammar, engine="hf").sequences
    free = specdec.generate(target, prompts, draft, max_new_tokens=32, temperature=0, num_draft_tokens=4,
                            engine="hf").sequences
    gpu_target, gpu_draft = type(target).from_pretrained(DEMO / "target").cuda().eval(), \
        type(draft).from_pretrained(DEMO / "draft").cuda().eval()
    engine = Engine(gpu_target, gpu_draft, EngineConfig(max_batch_size=8, max_seq_len=256, num_draft_tokens=4))
    assert engine.cuda_graphs
    eos = (tokenizer.eos_token_id,)
    for _ in range(2):  # the second run replays what the first captured
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=32, temperature=0, eos_token_ids=eos,
                                                    constraint=grammar if i % 2 == 0 else None))
               for i, p in enumerate(prompts * 2)]
        out = {i: [] for i in ids}
        while engine.has_unfinished():
            for o in engine.step():
                out[o.request_id].extend(o.new_token_ids)
        for i, rid in enumerate(ids):
            ref = cpu[i % len(prompts)] if i % 2 == 0 else free[i % len(prompts)]
            _same_or_tie(target, grammar if i % 2 == 0 else None, prompts[i % len(prompts)], out[rid], ref)


def _same_or_tie(target, grammar, prompt, ours, ref, tie=1e-3):
    if ours == ref:
        return
    i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    with torch.no_grad():
        logits = target(torch.tensor([prompt + ref[:i]])).logits[0, -1].float()
    if grammar is not None:
        logits = logits.masked_fill(~grammar.start(logits.shape[-1]).allowed(ref[:i])[-1], float("-inf"))
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) < tie, f"differ at token {i} with a clear margin: ours={ours} ref={ref}"
