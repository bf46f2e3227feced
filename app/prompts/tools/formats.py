"""Which format a model writes calls in, told by its chat template's markers, and a conversation with tools made
ready for that template (calls and results written as it expects, or the tools taught where it knows none)."""
from __future__ import annotations

from ...engine.errors import EngineError
from .base import Format, Tool
from .gemma4 import Gemma4
from .gpt_oss import GptOss
from .hermes import Hermes, QwenXml
from .lfm2 import Lfm2
from .llama3 import Llama3
from .mistral import Mistral

# Formats told by their template's markers (llama.cpp's own checks, common/chat.cpp), most specific first; the
# families SpecChat does not read yet are refused by name rather than answered in another family's format.
FORMATS: list[tuple[tuple[str, ...], Format | str]] = [
    (("[TOOL_CALLS]", "[CALL_ID]"), "Mistral Small 3.2 ([TOOL_CALLS]name[CALL_ID]id[ARGS])"),
    (("[TOOL_CALLS]", "[ARGS]"), Mistral()),
    (("[TOOL_CALLS]",), "Mistral Nemo ([TOOL_CALLS][{...}])"),
    (("<|channel|>",), GptOss()),
    (("List of tools: [",), Lfm2()),
    (("<|tool_list_start|>",), Lfm2()),
    (("<|tool_call>",), Gemma4()),
    (("<tool_call>", "<function=", "<parameter="), QwenXml()),
    (("<tool_call>",), Hermes()),
    (('"parameters": ', "ipython"), Llama3()),
]


def knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def tool_format(template: str | None) -> Format:
    """The format a model writes calls in, from its template's markers (Hermes where the template knows none)."""
    for markers, fmt in FORMATS:
        if template and all(m in template for m in markers):
            if isinstance(fmt, str):
                raise EngineError(f"This model writes tool calls in the {fmt} format, which SpecChat does not read "
                                  "yet: use a model of the Qwen2.5/Qwen3/Qwen3.5/Granite, Ministral 3, Gemma 4, LFM2, "
                                  "gpt-oss or Llama 3.x families, or one whose template knows no tools.")
            return fmt
    return Hermes()


def prepare_messages(messages: list[dict], tools: list[Tool], template: str | None) -> tuple[list[dict], dict]:
    """Messages and template variables for a conversation with tools. Arguments of earlier calls become objects
    (templates write them with tojson or iterate them). A template that knows no tools gets them taught in the
    system message, earlier calls written into the assistant's text and results as user turns (Hermes)."""
    taught = Hermes()
    if template and "tool_calls[0]" in template:  # (gpt-oss's renders only an answer's first call)
        messages = _one_call_each(messages)
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if knows_tools(template):
            if calls and "tool_calls" not in template:  # (LFM2.5-Instruct's lists tools but writes no calls)
                own = tool_format(template)
                m["content"] += "".join(own.write(c["name"], c["arguments"]) for c in calls)
            elif calls:
                m["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
            out.append(m)
            continue
        if calls:
            text = "\n".join(taught.write(c["name"], c["arguments"]) for c in calls)
            m["content"] = (m["content"] + "\n" if m["content"] else "") + text
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if knows_tools(template):
        return out, {"tools": [t.as_openai() for t in tools]} if tools else {}
    if tools:
        teach = taught.teach(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + teach}
        else:
            out.insert(0, {"role": "system", "content": teach})
    return out, {}


def _one_call_each(messages: list[dict]) -> list[dict]:
    """An answer with several calls as answers of one call each, every one followed by its result."""
    out, i = [], 0
    while i < len(messages):
        m, calls = messages[i], messages[i].get("tool_calls") or []
        j = i + 1
        if m["role"] != "assistant" or len(calls) < 2:
            out.append(m)
            i = j
            continue
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        results = messages[i + 1:j]
        by_id = {r.get("tool_call_id"): r for r in results}
        for k, call in enumerate(calls):
            out.append({**m, "content": m["content"] if k == 0 else "", "tool_calls": [call]})
            result = by_id.get(call["id"]) or (results[k] if k < len(results) else None)
            if result is not None:
                out.append(result)
        i = j
    return out
