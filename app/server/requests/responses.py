"""A Responses body (``input`` as text or items: messages, ``function_call`` and ``function_call_output``;
``instructions``; ``max_output_tokens``; flat function ``tools``; ``text.format`` for a JSON schema) read into the
chat body ``requests.openai.parse`` reads: every API runs one job shape. A mistake is a 400 naming the field.

As llama-server: nothing is stored (``previous_response_id`` is refused: send the whole conversation as ``input``)
and tools other than functions are skipped."""
from __future__ import annotations

from ..http import ApiError

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
