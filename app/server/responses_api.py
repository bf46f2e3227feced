"""OpenAI's Responses API (``POST /v1/responses``) over the loaded pair, for Codex-style clients and agents.

A request is read as the Responses API writes it (``input`` as text or items: messages, ``function_call`` and
``function_call_output``; ``instructions``; ``max_output_tokens``; flat function ``tools``; ``text.format`` for a
JSON schema), turned into the chat body ``request_body.parse`` reads, and answered through ``OpenAIServer``'s own
steps: the same prompt rendering, tool formats, grammar, queue, cancellation, speculation (``speculative.n_max: 0``
turns it off per request, as on the chat endpoint) and llama-server's ``timings``. The answer is a ``Response``
object, or with ``stream`` its Server-Sent Events (``response.created`` … ``response.completed``), in the shapes
the official ``openai`` client parses. Errors are OpenAI's.

As llama-server: nothing is stored (``previous_response_id`` is refused: send the whole conversation as ``input``),
tools other than functions are skipped, and the stream ends with ``response.completed`` even when
``max_output_tokens`` cut the answer (its ``status`` then says ``incomplete``, with the reason).
"""
from __future__ import annotations

import json
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse

from ..engine import Done, EngineError, PromptProgress, Round, Stats, TextDelta
from .openai_api import _Held, _json_body, progress_stats, prompt_progress, sse, timings
from .request_body import ApiError

# Fields taken as they are on the chat endpoint (llama-server's and SpecChat's own), beside the Responses API's.
_PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "speculative", "drafter",
           "chat_template_kwargs", "timings_per_token", "parallel_tool_calls", "n_predict", "return_progress")
_TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body) -> dict:
    """The chat-completions body that asks for what a Responses body asks; any mistake is a 400 naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    if body.get("previous_response_id"):
        raise ApiError(400, "'previous_response_id' is not supported: this server stores no responses; send the "
                            "whole conversation as 'input'.", param="previous_response_id")
    if body.get("background"):
        raise ApiError(400, "'background' responses are not supported.", param="background")
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string.", param="instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            _item(item, f"input[{i}]", messages)
    else:
        raise ApiError(400, "'input' must be a string or a non-empty list of items.", param="input")
    out = {k: v for k, v in body.items() if k in _PASSED or k.startswith("speculative.")}
    out.update(messages=messages, stream=body.get("stream"))
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    out.update(_tools(body))
    fmt = _format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    return out


def _item(item, where: str, messages: list[dict]) -> None:
    """One input item added to ``messages``: a message, a past function call (joined to the assistant message
    before it), a function's output (a ``tool`` message); reasoning items are left out, as templates leave out
    earlier turns' thinking."""
    kind = item.get("type", "message") if isinstance(item, dict) else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ApiError(400, f"{where}.role must be user, assistant, system or developer.", param="input")
        messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise ApiError(400, f"{where}: a function_call item needs 'call_id', 'name' and 'arguments' (a JSON "
                                "string).", param="input")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise ApiError(400, f"{where}: a function_call_output item needs its 'call_id'.", param="input")
        messages.append({"role": "tool", "tool_call_id": item["call_id"],
                         "content": _content(item.get("output"), f"{where}.output")})
    elif kind != "reasoning":
        raise ApiError(400, f"{where}: items of type {kind!r} are not supported (message, function_call, "
                            "function_call_output and reasoning are).", param="input")


def _content(content, where: str):
    """A string, or the Responses API's parts as chat parts (text; an image as an ``image_url`` part)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content parts.", param="input")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise ApiError(400, f"{where}[{i}]: a part must be input_text or output_text with its 'text' (got "
                                f"{kind!r}).", param="input")
    return parts


def _tools(body: dict) -> dict:
    """Function tools (flat: name, description, parameters) and ``tool_choice`` as the chat endpoint takes them;
    other kinds of tool (web search, files…) are skipped, as llama-server does."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ApiError(400, "'tools' must be a list of tool objects.", param="tools")
    functions = [{"type": "function", "function": {k: t.get(k) for k in ("name", "description", "parameters")}}
                 for t in tools or () if t.get("type") == "function"]
    out = {"tools": functions} if functions else {}
    if choice is None or (not functions and choice in ("auto", "none")):
        return out
    if choice in ("auto", "none", "required"):
        out["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise ApiError(400, "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": NAME}.",
                       param="tool_choice")
    return out


def _format(text) -> dict | None:
    """``text.format`` as the chat endpoint's ``response_format`` (None: plain text)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise ApiError(400, "'text' must be an object, with the format under 'format'.", param="text")
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema", {}),
                                                       "strict": fmt.get("strict")}}
    raise ApiError(400, "'text.format.type' must be text, json_object or json_schema.", param="text")


class Responses:
    """``POST /v1/responses`` answered by an ``OpenAIServer`` (its runtime, queue, defaults and log)."""

    def __init__(self, server):
        self.server = server

    async def create(self, request: Request):
        body = await _json_body(request)
        started = await self.server._begin(request, chat_body(body), True)
        meta = dict(id=f"resp_{uuid.uuid4().hex}", message_id=f"msg_{uuid.uuid4().hex}", created=int(time.time()),
                    model=body.get("model") or started.loaded, prompt_n=len(started.ids), tools=started.reader,
                    offered=started.job.tools, echo=_echo(body), chat=True)
        if started.job.stream:
            return sse(_Stream(meta, started.job.timings_per_token).events(started, self.server))
        done = await started.finish()
        self.server._log(meta, done, True)
        return JSONResponse(response(meta, done))


    async def input_tokens(self, request: Request):
        """llama-server's ``/responses/input_tokens``: ``{"input_tokens": N}`` for a Responses body."""
        return await self.server.input_tokens(chat_body(await _json_body(request)))


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


def response(meta: dict, done: Done | None, output: list[dict] | None = None) -> dict:
    """The Response object: in progress (``done`` None) or finished, with its output items, usage and timings."""
    out = {"id": meta["id"], "object": "response", "created_at": meta["created"], "status": "in_progress",
           "error": None, "incomplete_details": None, "model": meta["model"], **meta["echo"], "usage": None,
           "output": output if output is not None else items(meta, done) if done else []}
    if done is not None:
        cut = done.finish_reason == "length"
        out.update(status="incomplete" if cut else "completed", completed_at=int(time.time()),
                   incomplete_details={"reason": "max_output_tokens"} if cut else None,
                   usage=usage(meta["prompt_n"], done.stats), timings=timings(done.stats))
    return out


def usage(prompt_n: int, stats: Stats) -> dict:
    return {"input_tokens": prompt_n, "input_tokens_details": {"cached_tokens": stats.prompt_cached},
            "output_tokens": stats.n_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_n + stats.n_tokens}


def items(meta: dict, done: Done) -> list[dict]:
    """The output items of a finished answer: its message (left out when empty and there are calls), then a
    ``function_call`` item per call read from it."""
    text, calls = meta["tools"].parse(done.text, meta["offered"]) if meta["tools"] else (done.text, [])
    status = "incomplete" if done.finish_reason == "length" else "completed"
    return ([message_item(meta["message_id"], text, status)] if text or not calls else []) + [
        call_item(c, "completed") for c in calls]


def message_item(item_id: str, text: str | None, status: str) -> dict:
    """A message output item (``text`` None: the empty one a stream opens)."""
    content = [] if text is None else [_text_part(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call, status: str, arguments: str | None = None) -> dict:
    return {"id": f"fc_{call.id}", "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _Stream:
    """One streamed Response: its events, numbered, in the order the official client accumulates them."""

    def __init__(self, meta: dict, timings_per_token: bool):
        self.meta, self.timings_per_token = meta, timings_per_token
        self.sequence = 0
        self.stats = Stats()

    def event(self, kind: str, with_timings: bool = False, **fields) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        if with_timings or (self.timings_per_token and kind == "response.output_text.delta"):
            data["timings"] = timings(self.stats)
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _open(self) -> list[str]:
        """The message item and its text part, opened."""
        item_id = self.meta["message_id"]
        return [self.event("response.output_item.added", output_index=0,
                           item=message_item(item_id, None, "in_progress")),
                self.event("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
                           part=_text_part(""))]

    def _delta(self, text: str) -> str:
        return self.event("response.output_text.delta", item_id=self.meta["message_id"], output_index=0,
                          content_index=0, delta=text, logprobs=[])

    async def events(self, started, server):
        meta, done = self.meta, None
        held = _Held(meta["tools"]) if meta["tools"] else None  # text that may begin a call waits
        try:
            yield self.event("response.created", response=response(meta, None))
            yield self.event("response.in_progress", response=response(meta, None))
            opened = held is None  # (with tools offered, the message opens once there is text)
            if opened:
                for e in self._open():
                    yield e
            batch, streamed = started.first, ""
            while True:
                for ev in batch:
                    if isinstance(ev, (Round, Done)):
                        self.stats = ev.stats
                    elif isinstance(ev, PromptProgress):  # (asked for with return_progress: llama-server's event)
                        self.stats = progress_stats(ev)
                        yield self.event("response.in_progress", with_timings=self.timings_per_token,
                                         response=response(meta, None), prompt_progress=prompt_progress(ev))
                done = batch[-1] if isinstance(batch[-1], Done) else None
                text = "".join(ev.text for ev in batch if isinstance(ev, TextDelta))
                text = held.feed(text) if held is not None else text
                if text:
                    if not opened:
                        opened = True
                        for e in self._open():
                            yield e
                    streamed += text
                    yield self._delta(text)
                if done is not None:
                    break
                batch = await anext(started.batches)
            output = items(meta, done)
            message = next((i for i in output if i["type"] == "message"), None)
            if message is not None and not opened:
                opened = True
                for e in self._open():
                    yield e
            if opened:
                text = message["content"][0]["text"] if message else streamed
                if text[len(streamed):]:  # what waited and is text after all
                    yield self._delta(text[len(streamed):])
                message = message or message_item(meta["message_id"], text, "completed")
                output = [message] + [i for i in output if i["type"] != "message"]
                yield self.event("response.output_text.done", item_id=message["id"], output_index=0, content_index=0,
                                 text=text, logprobs=[])
                yield self.event("response.content_part.done", item_id=message["id"], output_index=0,
                                 content_index=0, part=_text_part(text))
                yield self.event("response.output_item.done", output_index=0, item=message)
            for index, item in enumerate(output[1 if opened else 0:], start=1 if opened else 0):
                yield self.event("response.output_item.added", output_index=index,
                                 item={**item, "status": "in_progress", "arguments": ""})
                yield self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                 delta=item["arguments"])
                yield self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                 name=item["name"], arguments=item["arguments"])
                yield self.event("response.output_item.done", output_index=index, item=item)
            yield self.event("response.completed", with_timings=True, response=response(meta, done, output))
        except EngineError as exc:  # after the headers went out: the error as the stream's last event
            yield self.event("error", code="server_error", message=str(exc), param=None)
        finally:
            await started.close()  # a client gone away lands here too: the generation stops now
            if done is not None:
                server._log(meta, done, True)
