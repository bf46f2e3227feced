"""OpenAI's Responses API (``POST /v1/responses``, ``/v1/responses/input_tokens``) over the loaded pair, for
Codex-style clients and agents.

A body is read by ``requests.responses`` into the one job and answered as every API is: the same prompt rendering,
tool formats, grammar, queue, cancellation, speculation (``speculative.n_max: 0`` turns it off per request, as on
the chat endpoint) and llama-server's ``timings``. The answer is a ``Response`` object, or with ``stream`` its
Server-Sent Events (``response.created`` … ``response.completed``), in the shapes the official ``openai`` client
parses. Errors are OpenAI's. As llama-server, the stream ends with ``response.completed`` even when
``max_output_tokens`` cut the answer (its ``status`` then says ``incomplete``, with the reason).
"""
from __future__ import annotations

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...engine import Done, EngineError, Stats
from ..answer import Answer, Step, progress_stats, prompt_progress, stream, timings
from ..http import json_body, sse
from ..requests.responses import chat_body


def routes(api: FastAPI, server) -> None:
    """The Responses API's routes on ``api``, answered by ``server`` (the app's ``ApiServer``)."""

    async def create(request: Request):
        body = await json_body(request)
        answer = await server.begin(request, chat_body(body), True, id=f"resp_{uuid.uuid4().hex}",
                                    model=body.get("model"))
        reply = Reply(body)
        if answer.job.stream:
            return sse(stream(answer, reply, server.log))
        done = await answer.finish()
        server.log(answer)
        return JSONResponse(reply.response(answer, done))

    async def input_tokens(request: Request):
        """llama-server's ``/responses/input_tokens``: ``{"input_tokens": N}`` for a Responses body."""
        return await server.input_tokens(chat_body(await json_body(request)))

    api.post("/responses")(create)
    api.post("/responses/input_tokens")(input_tokens)


class Reply:
    """One Response: the object, whole or in progress, and streamed, its events numbered in the order the official
    client accumulates them."""

    def __init__(self, body: dict):
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.echo = _echo(body)
        self.sequence = 0
        self.opened = False  # the message item (with tools offered, it opens once there is text)
        self.streamed = ""

    def response(self, answer: Answer, done: Done | None, output: list[dict] | None = None) -> dict:
        """The Response object: in progress (``done`` None) or finished, with its output items, usage and
        timings."""
        out = {"id": answer.id, "object": "response", "created_at": answer.created, "status": "in_progress",
               "error": None, "incomplete_details": None, "model": answer.model, **self.echo, "usage": None,
               "output": output if output is not None else self.items(answer, done) if done else []}
        if done is not None:
            cut = done.finish_reason == "length"
            out.update(status="incomplete" if cut else "completed", completed_at=int(time.time()),
                       incomplete_details={"reason": "max_output_tokens"} if cut else None,
                       usage=usage(answer.prompt_n, done.stats), timings=timings(done.stats))
        return out

    def items(self, answer: Answer, done: Done) -> list[dict]:
        """The output items of a finished answer: its message (left out when empty and there are calls), then a
        ``function_call`` item per call read from it."""
        text, calls = answer.parsed(done)
        status = "incomplete" if done.finish_reason == "length" else "completed"
        return ([message_item(self.message_id, text, status)] if text or not calls else []) + [
            call_item(c, "completed") for c in calls]

    # --- streamed -------------------------------------------------------------------------------------------
    def event(self, kind: str, stats: Stats | None = None, **fields) -> str:
        """One event, numbered; with llama-server's ``timings`` of ``stats`` where given."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        if stats is not None:
            data["timings"] = timings(stats)
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self, answer: Answer):
        yield self.event("response.created", response=self.response(answer, None))
        yield self.event("response.in_progress", response=self.response(answer, None))
        if answer.reader is None:
            yield from self._open()

    def step(self, answer: Answer, step: Step):
        per_token = answer.job.timings_per_token
        for ev in step.progress:  # (asked for with return_progress: llama-server's event)
            yield self.event("response.in_progress", progress_stats(ev) if per_token else None,
                             response=self.response(answer, None), prompt_progress=prompt_progress(ev))
        if step.text:
            if not self.opened:
                yield from self._open()
            self.streamed += step.text
            yield self._delta(step.text, answer.stats if per_token else None)

    def end(self, answer: Answer, done: Done):
        output = self.items(answer, done)
        message = next((i for i in output if i["type"] == "message"), None)
        if message is not None and not self.opened:
            yield from self._open()
        if self.opened:
            text = message["content"][0]["text"] if message else self.streamed
            if text[len(self.streamed):]:  # what waited and is text after all
                yield self._delta(text[len(self.streamed):], answer.stats if answer.job.timings_per_token else None)
            message = message or message_item(self.message_id, text, "completed")
            output = [message] + [i for i in output if i["type"] != "message"]
            yield self.event("response.output_text.done", item_id=message["id"], output_index=0, content_index=0,
                             text=text, logprobs=[])
            yield self.event("response.content_part.done", item_id=message["id"], output_index=0, content_index=0,
                             part=_text_part(text))
            yield self.event("response.output_item.done", output_index=0, item=message)
        for index, item in enumerate(output[1 if self.opened else 0:], start=1 if self.opened else 0):
            yield self.event("response.output_item.added", output_index=index,
                             item={**item, "status": "in_progress", "arguments": ""})
            yield self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                             delta=item["arguments"])
            yield self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                             name=item["name"], arguments=item["arguments"])
            yield self.event("response.output_item.done", output_index=index, item=item)
        yield self.event("response.completed", done.stats, response=self.response(answer, done, output))

    def error(self, exc: EngineError) -> str:
        return self.event("error", code="server_error", message=str(exc), param=None)

    def _open(self):
        """The message item and its text part, opened."""
        self.opened = True
        yield self.event("response.output_item.added", output_index=0,
                         item=message_item(self.message_id, None, "in_progress"))
        yield self.event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0,
                         part=_text_part(""))

    def _delta(self, text: str, stats: Stats | None) -> str:
        return self.event("response.output_text.delta", stats, item_id=self.message_id, output_index=0,
                          content_index=0, delta=text, logprobs=[])


def _echo(body: dict) -> dict:
    """What a Response repeats of its request."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": [t for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"],
            "text": {"format": text.get("format") or {"type": "text"}}, "metadata": body.get("metadata") or {},
            "store": False, "previous_response_id": None, "reasoning": None, "truncation": "disabled",
            "user": body.get("user")}


def usage(prompt_n: int, stats: Stats) -> dict:
    return {"input_tokens": prompt_n, "input_tokens_details": {"cached_tokens": stats.prompt_cached},
            "output_tokens": stats.n_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_n + stats.n_tokens}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    """A message output item (``text`` None: the empty one a stream opens)."""
    content = [] if text is None else [_text_part(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call, status: str, arguments: str | None = None) -> dict:
    return {"id": f"fc_{call.id}", "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
