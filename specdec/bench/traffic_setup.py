"""The engines and prompts a traffic run measures (`specdec.bench.traffic`), and the run itself for the CLI.

- `quick_setup`: CPU, tiny random Llamas (a 4-layer target; a perturbed 2-layer copy as the model drafter, so α
  is high; an untrained feature head started from the target's last layer; prompt lookup; a bigram fitted on
  the prompts). Checks structure, not speed: this is what CI runs.
- `target_setup`: a real model (`--target`: a GGUF file or a transformers folder, e.g. SmolLM2-135M-Instruct) with
  the drafter trained for it (`--draft`: a feature head folder, or a draft model folder over the same vocabulary),
  on CUDA in bf16 or on the CPU in fp32; prompts are chat and code requests through the model's chat template.
- `pair_setup`: the zoo `gpu` pair (`specdec train pair --preset gpu`: target/ and draft0/ in one folder), its
  feature head (`specdec train head`), the prepared code corpus (tokenizer, the bigram's training text), on
  CUDA in bf16; prompts are the held-in code prompts (`specdec.bench.prompts`), glued to the lengths drawn.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.bench.traffic import TrafficSpec, run_traffic
from specdec.bench.traffic_table import markdown_table, never_drafted, plot_table, summary
from specdec.engine import Engine, EngineConfig

__all__ = ["DRAFTERS", "TrafficSetup", "quick_models", "quick_setup", "pair_setup", "target_setup", "draft_kind", "chat_pool",
           "run_and_write"]

#: every drafter the engine runs: a small model, a feature head, prompt lookup, an n-gram (bigram) table
DRAFTERS = ("model", "head", "lookup", "ngram")


@dataclass
class TrafficSetup:
    plain: Engine
    arms: dict  # drafter name → Engine
    pool: list  # prompts (token ids) the traffic's prompts are cut from
    eos_ids: tuple
    max_total: int  # the engines' max_seq_len
    device: str
    notes: list = field(default_factory=list)


#: the engines' largest γ ("auto" chooses up to it; a fixed --policy must not exceed it)
MAX_DRAFT_TOKENS = 8


@dataclass(frozen=True)
class EngineVariant:
    """The engine options every arm of one table shares (plain's too), for A/B tables; None = the engine's default
    (`EngineConfig`). mixed_step — the mixed prefill/decode step (`EngineConfig.mixed_step`: True, False or "auto";
    given, the table runs on the paged pool it needs with prefix caching off: the table compares drafters, not
    caching); async_scheduling — the host ahead of the device (`EngineConfig.async_scheduling`)."""

    mixed_step: bool | str | None = None
    async_scheduling: bool | None = None

    def options(self) -> dict:
        out: dict = {}
        if self.mixed_step is not None:
            out.update(kv_layout="paged", mixed_step=self.mixed_step, enable_prefix_caching=False)
        if self.async_scheduling is not None:
            out["async_scheduling"] = self.async_scheduling
        return out

    def notes(self) -> list[str]:
        notes = []
        if self.mixed_step is not None:
            word = {True: "on", False: "off"}.get(self.mixed_step, self.mixed_step)
            notes.append(f"mixed step {word}: every arm's engine (plain's too) on the paged pool (prefix "
                         "caching off)" + (", prompt chunks inside the decode / verify steps' one forward under the "
                                           "'auto' budget" if self.mixed_step else ", prompts prefilled whole"))
        if self.async_scheduling is not None:
            notes.append(f"async scheduling {'on' if self.async_scheduling else 'off'}: every arm's engine "
                         + ("launches a step before the previous record is read" if self.async_scheduling
                            else "reads each step's record before it launches the next"))
        return notes

    def server_args(self) -> tuple[str, ...]:
        args: tuple[str, ...] = ()
        if self.mixed_step is not None:
            args += ("--mixed-step", str(self.mixed_step).lower())
        if self.async_scheduling is not None:
            args += ("--async-scheduling" if self.async_scheduling else "--no-async-scheduling",)
        return args


def _config(max_batch: int, max_seq_len: int | None, variant: EngineVariant = EngineVariant()) -> EngineConfig:
    """Every arm's engine config (plain's too), with the table's `EngineVariant`."""
    return EngineConfig(max_batch_size=max_batch, max_seq_len=max_seq_len, num_draft_tokens="auto",
                        max_draft_tokens=MAX_DRAFT_TOKENS, **variant.options())


def _arms(target, drafters, config, *, draft=None, head=None, corpus=None) -> dict:
    from specdec.drafters import NGramDrafter, PromptLookupDrafter

    arms = {}
    for name in drafters:
        if name == "model":
            arms[name] = Engine(target, draft, config)
        elif name == "head":
            arms[name] = Engine(target, head, config)
        elif name == "lookup":
            arms[name] = Engine(target, PromptLookupDrafter(), config)
        elif name == "ngram":
            arms[name] = Engine(target, NGramDrafter(order=2).fit(corpus, target.config.vocab_size), config)
    return arms


def quick_models(with_head: bool = True) -> tuple:
    """(target, model drafter, feature head or None): a tiny random 4-layer Llama (vocabulary 256), a perturbed
    2-layer copy of it (α high) and an untrained feature head started from its last layer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512)
    target = LlamaForCausalLM(cfg).eval()
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.003)
    head = None
    if with_head:
        trainable = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
        trainable.init_from(target)
        head = trainable.to_feature_head()
    return target, draft, head


def quick_setup(drafters=DRAFTERS, max_batch: int = 8, variant: EngineVariant = EngineVariant()) -> TrafficSetup:
    from specdec.bench.presets import motif_prompts

    target, draft, head = quick_models(with_head="head" in drafters)
    pool = motif_prompts(256, 16, 48, seed=2)
    config = _config(max_batch, 256, variant)
    arms = _arms(target, drafters, config, draft=draft, head=head, corpus=pool)
    return TrafficSetup(Engine(target, None, config), arms, pool, (2,), 256, "cpu",
                        ["quick: tiny random Llamas on CPU (EOS = token 2): a check of the harness, not a speed claim",
                         *variant.notes()])


def pair_setup(pair: Path, data: Path, head: Path | None, drafters=DRAFTERS, max_batch: int = 64,
               device: torch.device | None = None, variant: EngineVariant = EngineVariant()) -> TrafficSetup:
    from specdec.bench.presets import load_pair

    device = device or torch.device("cuda")
    target, draft = load_pair(Path(pair), device, torch.bfloat16)
    if "head" in drafters and head is None:
        raise ValueError("the head drafter needs --head DIR (a trained feature head; or leave 'head' out of --drafters)")
    max_total = min(int(target.config.max_position_embeddings), 4096)
    pool = code_pool(data, max_total)
    corpus = None
    if "ngram" in drafters:
        from specdec.zoo.data import TokenData

        corpus = [TokenData.load(Path(data)).train[:4_000_000].astype("int64").tolist()]
    eos = target.config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    config = _config(max_batch, max_total, variant)
    arms = _arms(target, drafters, config, draft=draft, head=str(head) if head else None, corpus=corpus)
    notes = [f"zoo pair {pair} (context {max_total} tokens: prompts are cut to fit prompt + max_new_tokens)",
             f"EOS ids {list(eos_ids)}; prompts from {len(pool)} held-in code prompts (specdec.bench.prompts)",
             *variant.notes()]
    return TrafficSetup(Engine(target, None, config), arms, pool, eos_ids, max_total, torch.cuda.get_device_name(device),
                        notes)


#: `specdec bench` (the traffic table) on a GPU, and its --quick CPU form
GPU_SPEC = dict(slots=(64, 32, 8, 1),  # (the big batches first: --max-seconds cuts the tail)
                arrivals=("closed", "poisson:0.8x"), policies=("auto", 4), prompt_tokens=(30, 2000),
                new_tokens=(16, 256), requests_per_slot=3.0, min_requests=16)
QUICK_SPEC = dict(slots=(1, 4), arrivals=("closed", "poisson:0.8x"), policies=("auto",), prompt_tokens=(20, 100),
                  new_tokens=(2, 16), requests_per_slot=1.5, min_requests=3)


def draft_kind(folder: Path) -> str:
    """"head" for a feature head folder (feature_head.json), "model" for a draft model folder (config.json);
    ValueError in one line otherwise."""
    folder = Path(folder)
    if (folder / "feature_head.json").is_file():
        return "head"
    if (folder / "config.json").is_file():
        return "model"
    raise ValueError(f"--draft {folder}: neither a feature head folder (feature_head.json) nor a draft model folder "
                     "(config.json)")


def chat_pool(tokenizer, count: int = 160, max_tokens: int = 1024) -> list[list[int]]:
    """Chat and code requests through the tokenizer's chat template (plain text without one): the demo's and the
    general questions, then prompts `specdec.zoo.instructions.build_prompts` makes from local text (seed 1)."""
    from specdec.bench.smol_tables import held_out_prompts

    texts = held_out_prompts(count, exclude=set())
    if getattr(tokenizer, "chat_template", None):
        from specdec.zoo.responses import chat_prompt_ids

        ids = chat_prompt_ids(tokenizer, texts)
    else:
        ids = [list(tokenizer(t)["input_ids"]) for t in texts]
    return [p[:max_tokens] for p in ids if p]


def target_setup(target: Path, draft: Path | None, drafters=DRAFTERS, max_batch: int = 64,
                 device: torch.device | None = None, max_context: int = 4096,
                 variant: EngineVariant = EngineVariant()) -> TrafficSetup:
    """A real model and the drafter trained for it: bf16 on CUDA, fp32 on the CPU. drafters: "head" / "model" (the
    one `draft` is, see `draft_kind`), "lookup", "ngram" (a bigram fitted on the prompts)."""
    from specdec.loading import load_model, load_tokenizer
    from specdec.zoo.responses import stop_token_ids

    device = device or torch.device("cuda")
    kind = draft_kind(draft) if draft is not None else None
    for name in ("head", "model"):
        if name in drafters and kind != name:
            raise ValueError(f"the {name} drafter needs --draft DIR, a {'feature head' if name == 'head' else 'draft model'}"
                             f" folder (got {'none' if draft is None else f'a {kind} folder: {draft}'})")
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    model = load_model(target, device=device, dtype=dtype, what="target").eval()
    tokenizer = load_tokenizer(target, what="target")
    max_total = min(int(getattr(model.config, "max_position_embeddings", None) or max_context), max_context)
    pool = chat_pool(tokenizer, max_tokens=max_total // 2)
    small = None
    if "model" in drafters:
        small = load_model(draft, device=device, dtype=dtype, what="draft").eval()
        if small.config.vocab_size != model.config.vocab_size:
            raise ValueError(f"--draft {draft}: {small.config.vocab_size} tokens, the target has "
                             f"{model.config.vocab_size}")
    eos_ids = tuple(stop_token_ids(model, tokenizer))
    config = _config(max_batch, max_total, variant)
    arms = _arms(model, drafters, config, draft=small, head=str(draft) if "head" in drafters else None, corpus=pool)
    name = Path(target).name
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    notes = [f"target {name} ({dtype}, context {max_total} tokens), drafter {draft.name if draft else 'none'} ({kind}); "
             f"{len(pool)} chat/code prompts through the chat template (the demo's, the general questions, "
             "build_prompts seed 1; some may be among the drafter's training prompts), glued to the lengths drawn",
             f"EOS ids {list(eos_ids)}; the bigram is fitted on the prompts", *variant.notes()]
    if device.type == "cpu":
        notes.append(f"CPU ({torch.get_num_threads()} threads): fp32, not comparable with the GPU rows")
    return TrafficSetup(Engine(model, None, config), arms, pool, eos_ids, max_total, where, notes)


def code_pool(data: Path, context: int) -> list[list[int]]:
    """The held-in code prompts (`specdec.bench.prompts`) in the prepared corpus' tokenizer."""
    from tokenizers import Tokenizer

    from specdec.bench.prompts import code_prompts

    tokenizer = Tokenizer.from_file(str(Path(data) / "tokenizer" / "tokenizer.json"))
    return code_prompts(lambda s: tokenizer.encode(s).ids, count=160, max_tokens=context // 2)


def demo_pool() -> list[list[int]]:
    """The demo's prompts in the shipped demo pair's tokenizer (`specdec bench --quick --serve`)."""
    from specdec.bench.demo_pair import DEMO_PAIR
    from specdec.bench.demo_pair import PAIR_PROMPTS as PROMPTS
    from specdec.loading import load_tokenizer

    tokenizer = load_tokenizer(DEMO_PAIR / "target")
    return [tokenizer.encode(text) for text in PROMPTS]


def serve_and_write(spec: TrafficSpec, out: Path, *, pair: Path | None, data: Path | None, head: Path | None,
                    clients, quick: bool, log=None, max_seconds: float | None = None,
                    variant: EngineVariant = EngineVariant()) -> dict:
    """The serving levels (`specdec.bench.traffic_serve`): the zoo pair on CUDA (drafter: `head`, else draft0), or
    with `quick` the shipped demo pair on the CPU; writes `serve.json` and `serve.md` under `out`. variant: the
    server's flags (`--mixed-step`, `--async-scheduling`)."""
    from specdec.bench.traffic_serve import serve_traffic
    from specdec.bench.demo_pair import DEMO_PAIR
    from specdec.strict_json import dumps

    out.mkdir(parents=True, exist_ok=True)
    if quick:
        target, draft, pool, device, dtype = DEMO_PAIR / "target", DEMO_PAIR / "draft", demo_pool(), "cpu", "float32"
    else:
        target, draft, device, dtype = Path(pair) / "target", Path(head or Path(pair) / "draft0"), "cuda", "bfloat16"
        config = json.loads((Path(pair) / "target" / "config.json").read_text())
        pool = code_pool(data, min(int(config.get("max_position_embeddings") or 4096), 4096))
    start = time.perf_counter()
    result = serve_traffic(target, draft, pool, spec, tuple(clients), device=device, dtype=dtype, log=log,
                           max_seconds=max_seconds, server_args=variant.server_args())
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["mixed_step"], result["async_scheduling"] = variant.mixed_step, variant.async_scheduling
    result["spec"] = _spec_dict(spec)
    (out / "serve.json").write_text(dumps({k: v for k, v in result.items() if k != "markdown"}, indent=1))
    (out / "serve.md").write_text(result["markdown"] + "\n")
    return result


def run_and_write(spec: TrafficSpec, setup: TrafficSetup, out: Path, log=None, max_seconds: float | None = None) -> dict:
    """Run the traffic table, writing `traffic.partial.jsonl` as rows come (so a killed run leaves its rows), then
    `traffic.json`, `traffic.md` and `traffic.png` under `out` (the partial file removed) → the result object."""
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "traffic.partial.jsonl"
    partial.write_text("")
    start = time.perf_counter()

    def on_row(row) -> None:
        with partial.open("a") as fh:
            fh.write(json.dumps(row.to_dict(), default=str) + "\n")
        if log is not None:
            ratio = "" if row.vs_plain is None or row.drafter == "plain" else f" ({row.vs_plain:.2f}x plain)"
            ratio = " (never drafted)" if never_drafted(row) else ratio
            log(f"slots {row.slots} {row.arrival} {row.drafter} γ={row.policy}: {row.tok_s:.0f} tok/s{ratio}, "
                f"TTFT p50 {1e3 * row.ttft_p50_s:.0f} ms, ITL p99 {1e3 * row.itl_p99_s:.1f} ms"
                + (f", captures {row.captures}" if row.captures else ""))

    warmups: dict = {}  # name → its warm-up's report (each engine warmed before its first run)
    deadline = start + max_seconds if max_seconds else None
    rows = run_traffic(spec, setup.plain, setup.arms, setup.pool, setup.eos_ids, setup.max_total, on_row=on_row,
                       deadline=deadline, warmups=warmups, log=log)
    planned = sum(len(spec.arrivals) * (1 + len(setup.arms) * len(spec.policies)) for _ in spec.slots)
    if len(rows) < planned:
        setup.notes.append(f"--max-seconds {max_seconds:g}: {len(rows)} of {planned} rows measured, the rest skipped")
    result = {"device": setup.device, "notes": setup.notes, "spec": _spec_dict(spec), "warmup": warmups,
              "mixed_step": setup.plain.config.mixed_step,
              "async_scheduling": setup.plain.overlap is not None,  # (resolved: on with CUDA unless given)
              "rows": [r.to_dict() for r in rows], "summary": summary(rows),
              "seconds": round(time.perf_counter() - start, 1)}
    table = markdown_table(rows)
    from specdec.strict_json import dumps

    (out / "traffic.json").write_text(dumps(result, indent=1))
    (out / "traffic.md").write_text(table + "\n")
    if not plot_table(rows, out / "traffic.png") and log is not None:
        log("no traffic.png: the plot needs matplotlib (pip install 'specdec[plot]')")
    partial.unlink(missing_ok=True)  # every row is in traffic.json now
    result["markdown"] = table
    return result


def _spec_dict(spec: TrafficSpec) -> dict:
    return {"slots": list(spec.slots), "arrivals": [a.label for a in spec.arrivals], "policies": list(spec.policies),
            "requests": {s: spec.requests(s) for s in spec.slots}, "prompt_tokens": list(spec.prompt_tokens),
            "new_tokens": list(spec.new_tokens), "sampled_share": spec.sampled_share, "eos": spec.eos,
            "seed": spec.seed}
