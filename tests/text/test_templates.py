"""A chat template that fails while rendering (issue 35, item 7): any exception — jinja2's own, or another such
as the sandbox's `OverflowError: Range too big` for `range(10**8)` — is one `ChatTemplateError` line (a 400 on
the server: tests/server/test_bad_requests.py), and sandbox escapes stay contained."""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2")

from specdec.text.prompts import ChatTemplateError, apply_template, render_chat  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


def _tokenizer(template: str):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]")))
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("template, shown", [
    ("{% for i in range(10**8) %}{% endfor %}", "chat template: OverflowError: Range too big"),  # a 500 before
    ("{{ messages[0]['content'] + 1 }}", "chat template: "),
    ("{{ raise_exception('bad role') }}", "chat template: bad role"),
    ("{{ cycler.__init__.__globals__.os }}", "chat template: "),  # a sandbox escape: the sandbox refuses it
])
def test_a_failing_template_is_one_line_naming_the_template(template, shown):
    tok = _tokenizer(template)
    for render in (lambda: apply_template(tok, MESSAGES, add_generation_prompt=True),
                   lambda: render_chat(tok, MESSAGES)):  # the server's path and LLM.chat's
        with pytest.raises(ChatTemplateError) as caught:
            render()
        assert str(caught.value).startswith(shown) and "\n" not in str(caught.value) and len(str(caught.value)) < 260


def test_a_working_template_renders_unchanged():  # the negative control
    tok = _tokenizer("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}")
    assert apply_template(tok, MESSAGES, add_generation_prompt=True) == "[user] hi"
