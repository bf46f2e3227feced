"""An Anthropic Messages body (``max_tokens`` required, ``system`` as a string or text blocks, content as a string or
blocks: text, images, ``tool_use`` and ``tool_result``; ``tools``, ``tool_choice``, ``stop_sequences``) read into the
chat body ``requests.openai.parse`` reads: every API runs one job shape. A mistake is a 400 naming the field."""
from __future__ import annotations

import json

from ..http import ApiError

# Fields taken as they are on the chat endpoint (llama-server's and SpecChat's own), beside Anthropic's.
_PASSED = ("speculative", "drafter", "seed", "min_p", "chat_template_kwargs")


def _text_blocks(value, where: str) -> str:
    """A string, or a list of ``{"type": "text", "text"}`` blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise ApiError(400, f"{where}[{i}]: only text blocks are supported here (got {kind!r}).")
            parts.append(block["text"])
        return "".join(parts)
    raise ApiError(400, f"{where} must be a string or a list of text blocks.")


def chat_body(body) -> dict:
    """The chat-completions body that asks for what an Anthropic Messages body asks; any mistake is a 400."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise ApiError(400, "max_tokens: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, f"max_tokens: must be a positive integer, got {max_tokens!r}.")
    messages = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ApiError(400, "messages: must be a non-empty list of {role, content} objects.")
    for i, m in enumerate(given):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}].role: must be user or assistant.")
        messages.extend(_message(m, f"messages[{i}].content"))
    out = {"messages": messages, "max_tokens": max_tokens, "stream": body.get("stream")}
    out.update(_tools(body))
    for name in ("model", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    out.update({k: v for k, v in body.items() if k in _PASSED or k.startswith("speculative.")})
    return out


def _message(m: dict, where: str) -> list[dict]:
    """One Anthropic message as chat messages: an assistant's ``tool_use`` blocks become its ``tool_calls``, a
    user's ``tool_result`` blocks become ``tool`` messages (before the user's text, if any), a user's ``image``
    blocks OpenAI's ``image_url`` parts (read, and refused, as on the chat endpoint)."""
    content = m.get("content")
    if not isinstance(content, list):
        return [{"role": m["role"], "content": _text_blocks(content, where)}]
    parts, calls, results = [], [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise ApiError(400, f"{where}[{i}]: a tool_use block needs a 'name' and an 'input' object.")
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and m["role"] == "user":
            inner = block.get("content")
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                            "content": _text_blocks(inner if inner is not None else "", f"{where}[{i}].content")})
        elif kind == "image" and m["role"] == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), f"{where}[{i}]")}})
        else:
            parts.append({"type": "text", "text": _text_blocks([block], where)})
    images = any(p["type"] == "image_url" for p in parts)
    joined = parts if images else "".join(p["text"] for p in parts)
    out = results + ([{"role": m["role"], "content": joined}] if parts or calls else [])
    if calls:
        out[-1]["tool_calls"] = calls
    return out


def _image_url(source, where: str) -> str:
    """An image block's source as the URL of an OpenAI image part: base64 data as a data URL; a ``url`` source as
    it is (refused there: nothing is fetched)."""
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    if not (isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str)
            and isinstance(source.get("media_type"), str)):
        raise ApiError(400, f"{where}: an image block needs a source {{\"type\": \"base64\", \"media_type\": "
                            "\"image/png\", \"data\": \"...\"}.")
    return f"data:{source['media_type']};base64,{source['data']}"


def _tools(body: dict) -> dict:
    """Anthropic's ``tools`` (name, description, input_schema) and ``tool_choice`` as the chat endpoint takes them."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        return {}
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError(400, "tools: must be a list of {name, description, input_schema} objects.")
    out = {"tools": [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                       "parameters": t.get("input_schema")}} for t in tools]}
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        named = {"type": "function", "function": {"name": choice.get("name")}} if kind == "tool" else None
        picked = {"auto": "auto", "any": "required", "none": "none", "tool": named}.get(kind)
        if picked is None:
            raise ApiError(400, "tool_choice: must be {\"type\": auto, any, none or tool (with a name)}.")
        out["tool_choice"] = picked
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out
