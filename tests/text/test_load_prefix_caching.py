"""`specdec.load(..., enable_prefix_caching=...)` (vLLM's argument) and serve's flags: True runs the engine's prefix
cache on the paged pool and reports `Completion.num_cached_tokens`; False / None leave it off (today's default);
anything else is refused by name. `n > 1` copies of a prompt through `LLM.generate` share its blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdec
from specdec.cli import build_parser
from specdec.cli.aliases import expand_config, finish

DEMO = Path(specdec.__file__).parent / "assets" / "demo_pair"
PROMPT = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(8)) + "def main("


def test_the_argument_is_checked_before_loading():
    with pytest.raises(TypeError, match="enable_prefix_caching must be True, False or None"):
        specdec.load(DEMO / "target", enable_prefix_caching="yes")


@pytest.mark.parametrize("flags, want", [([], None), (["--enable-prefix-caching"], True),
                                         (["--no-enable-prefix-caching"], False), (["--no-prefix-caching"], False)])
def test_serve_flags(flags, want):
    parser = build_parser()
    args = finish(parser.parse_args(expand_config(["serve", "T", *flags], parser)))
    assert args.enable_prefix_caching is want


def test_load_with_prefix_caching_hits_and_n_shares_the_prompt():
    with specdec.load(DEMO / "target", draft=DEMO / "draft", num_draft_tokens=3, max_batch_size=4,
                      enable_prefix_caching=True) as llm:
        engine = llm.runner()
        assert engine.prefix_cache is not None and engine.config.kv_layout == "paged"
        first = llm.generate(PROMPT, max_new_tokens=8, temperature=0)
        again = llm.generate(PROMPT, max_new_tokens=8, temperature=0)
        assert first.num_cached_tokens == 0 and again.num_cached_tokens >= 16 and again.text == first.text
        hits = engine.prefix_cache_hits
        choices = llm.generate("# other\n" + PROMPT, max_new_tokens=6, temperature=1.0, seed=5, n=4)
        cached = [c.num_cached_tokens for c in choices]
        assert cached[0] == 0 and all(c >= 16 for c in cached[1:])  # one prefills, the other three hit
        assert engine.prefix_cache_hits - hits == sum(cached)
    with specdec.load(DEMO / "target", draft=DEMO / "draft", num_draft_tokens=3, max_batch_size=4,
                      enable_prefix_caching=False) as off:
        assert off.runner().prefix_cache is None
        plain = off.generate("# other\n" + PROMPT, max_new_tokens=6, temperature=1.0, seed=5, n=4)
        assert [c.token_ids for c in plain] == [c.token_ids for c in choices]  # seeded: the tokens of caching off
        assert [c.num_cached_tokens for c in plain] == [0] * 4
