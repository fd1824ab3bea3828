"""A finished `runs.Run` → the completions / chat response body, or its SSE stream.

Chat choices go through a `tool_parsers.ToolCallStream` each when the request has tools (content until a call
starts, then OpenAI `tool_calls` with `finish_reason: "tool_calls"`); without tools that stream passes the text
through unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging

from specdec.server import protocol as P
from specdec.server import responses as R
from specdec.server.runs import Run, describe
from specdec.server.tool_parsers import ToolCallStream

logger = logging.getLogger(__name__)

__all__ = ["full_body", "sse", "sse_event"]


def sse_event(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def full_body(run: Run, chat: bool, llm, model_name: str, tools: list[ToolCallStream] | None = None) -> dict:
    """The non-streamed body; `tools`: each choice's tool-call stream, already fed every delta."""
    completions = [r.completion() for r in run.requests]
    parsed = run.parsed
    choices = []
    for i, c in enumerate(completions):
        spec = parsed.choices[i]
        logprobs = None
        prefix = parsed.echo[spec.prompt_index] if parsed.echo is not None else ""
        if parsed.logprobs is not None:
            logprobs = (R.chat_logprobs(llm.tokenizer, c.token_ids, c.logprobs or [], parsed.top_logprobs,
                                        c.top_logprobs) if chat else
                        R.completion_logprobs(llm.tokenizer, c.token_ids, c.logprobs or [], len(prefix),
                                              c.top_logprobs))
        if chat:
            message, finish = {"role": "assistant", "content": c.text}, c.finish_reason
            if tools is not None:
                _, finish = tools[i].finish(c.finish_reason)
                message["content"] = tools[i].content
                if tools[i].calls:
                    message["tool_calls"] = [call.to_dict() for call in tools[i].calls]
            choice = {"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": i, "text": prefix + c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
        if c.stop_string is not None:
            choice["stop_reason"] = c.stop_string  # vLLM's field: which stop string ended the text
        if parsed.return_token_ids:
            choice["token_ids"] = list(c.token_ids)
            choice["prompt_token_ids"] = list(parsed.prompts[spec.prompt_index])
        choices.append(choice)
    stats = [c.stats for c in completions]
    return {"id": run.id(chat), "object": "chat.completion" if chat else "text_completion",
            "created": run.created, "model": model_name, "choices": choices,
            "usage": R.usage(parsed.prompts, completions),
            "speculative_decoding": R.speculative_decoding(stats),
            "specdec": R.specdec_extra(stats, run.gamma)}


async def sse(run: Run, chat: bool, llm, model_name: str, tools: list[ToolCallStream] | None = None):
    """The SSE stream of `run` (chunks in OpenAI's shape, then `data: [DONE]`)."""
    parsed = run.parsed

    def chunk(choices, **extra) -> str:
        return sse_event({"id": run.id(chat), "object": "chat.completion.chunk" if chat else "text_completion",
                          "created": run.created, "model": model_name, "choices": choices, **extra})

    offsets = [0] * len(run.requests)
    try:
        for i, spec in enumerate(parsed.choices):
            if chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            elif parsed.echo is not None:
                text = parsed.echo[spec.prompt_index]
                offsets[i] = len(text)
                yield chunk([{"index": i, "text": text, "logprobs": None, "finish_reason": None}])
        async for i, delta in run.events():
            if not delta.text and delta.finish_reason is None and not parsed.token_details:
                continue
            request = run.requests[i]
            logprobs = None
            ids = [p.token_id for p in delta.pieces if p.token_id >= 0]
            if parsed.logprobs is not None and ids:
                lps = [p.logprob for p in delta.pieces if p.token_id >= 0]
                tops = [p.top_logprobs or () for p in delta.pieces if p.token_id >= 0]
                logprobs = (R.chat_logprobs(llm.tokenizer, ids, lps, parsed.top_logprobs, tops) if chat else
                            R.completion_logprobs(llm.tokenizer, ids, lps, offsets[i], tops))
            offsets[i] += len(delta.text)
            finish = delta.finish_reason
            if chat and tools is not None:
                deltas = tools[i].feed(delta)
                if finish is not None:
                    last, finish = tools[i].finish(finish)
                    deltas += last
                elif not deltas and not parsed.token_details and logprobs is None:
                    continue  # held back (a possible call marker) or buffered (a call being generated)
                for d in deltas[:-1]:  # all but the last: alone; the last carries this step's extras
                    yield chunk([{"index": i, "delta": d, "logprobs": None, "finish_reason": None}])
                content = deltas[-1] if deltas else {}
                choice = {"index": i, "delta": content, "logprobs": logprobs, "finish_reason": finish}
            elif chat:
                content = {"content": delta.text} if delta.text or finish is None else {}
                choice = {"index": i, "delta": content, "logprobs": logprobs, "finish_reason": finish}
            else:
                choice = {"index": i, "text": delta.text, "logprobs": logprobs, "finish_reason": finish}
            if parsed.return_token_ids:
                choice["token_ids"] = ids
            extra = {"specdec": R.delta_extra(delta, parsed.token_details)}
            if finish is not None:
                stats = request.stats()
                extra["specdec"]["request"] = {**stats.to_dict(), "num_draft_tokens_per_step": run.gamma}
                extra["speculative_decoding"] = R.speculative_decoding([stats])
            yield chunk([choice], **extra)
        if parsed.include_usage:
            yield chunk([], usage=R.usage(parsed.prompts, [r.completion() for r in run.requests]))
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 - the stream has started: report in-band, as OpenAI does
        logger.error("generation failed mid-stream: %s", describe(err))
        yield sse_event(P.error_body(f"generation failed: {describe(err)}", type="server_error"))
    finally:
        run.abort_unfinished()
    yield "data: [DONE]\n\n"
