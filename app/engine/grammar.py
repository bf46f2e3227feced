"""Grammars that constrain an answer (a JSON schema, any JSON object, llama.cpp's GBNF, a Lark grammar), compiled
and checked by llguidance before a generation starts, so a bad one is refused with the library's own words.

JSON is laid out as ``json.dumps`` writes it (", " and ": ", no other whitespace): fixed separators are what let
the grammar force whole runs of keys and punctuation (drafted free, see ``constraint``), and they keep a model from
padding an answer with whitespace for ever, which a whitespace-flexible grammar allows.

Nothing here lets llguidance compile on the caller's stack: a schema or grammar is first held to the limits of
``grammar_limits`` (a refusal names the limit), then compiled through ``grammar_sandbox`` (a big stack, a child
process for a large one), so a hostile one is an ``EngineError``, never a crash of the process.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import EngineError
from .grammar_limits import MAX_GRAMMAR_NESTING, MAX_SCHEMA_DEPTH, check_grammar, check_schema
from .grammar_sandbox import on_big_stack, verdict

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """A compiled, checked grammar: llguidance's definition, and what it was made from (for messages)."""

    definition: str
    source: str  # "json_schema", "json_object", "gbnf", "lark"

    @classmethod
    def json_schema(cls, schema) -> Grammar:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise EngineError(f"The JSON schema is not valid JSON: {exc.msg} (at character {exc.pos}).") from None
            except RecursionError:
                raise EngineError("The JSON schema nests too deep to read; SpecChat accepts at most "
                                  f"{MAX_SCHEMA_DEPTH} levels.") from None
        if not isinstance(schema, (dict, bool)):
            raise EngineError("A JSON schema must be an object (or true/false).")
        text = check_schema(schema)  # (given as text, llguidance reads it without recursing in Python's types)
        try:
            definition = on_big_stack(_llguidance().LLMatcher.grammar_from_json_schema, text, defaults=JSON_LAYOUT)
        except ValueError as exc:
            raise EngineError(f"The JSON schema cannot be used: {exc}") from None
        return cls._checked(definition, "json_schema")

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """llama.cpp's GBNF (llama-server's ``grammar`` field); a Lark grammar is taken as well."""
        if not isinstance(text, str) or not text.strip():
            raise EngineError("The grammar is empty.")
        from llguidance.gbnf_to_lark import any_to_lark, is_lark_syntax

        check_grammar(text, lark=is_lark_syntax(text))
        try:
            lark = any_to_lark(text)
        except RecursionError:  # (the converter recurses in Python)
            raise EngineError(f"The grammar nests too deep; SpecChat accepts at most {MAX_GRAMMAR_NESTING} levels "
                              "of brackets.") from None
        except Exception as exc:  # the converter's own parse errors
            raise EngineError(f"The grammar is not valid GBNF: {exc}") from None
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(lark), "gbnf")

    @classmethod
    def lark(cls, text: str, source: str = "lark") -> Grammar:
        """llguidance's Lark (what tool-call grammars are written in: ``%json`` embeds a schema). Tool grammars
        (``source="tools"``) are ours, made from schemas already held to the limits: only contained."""
        if source != "tools":
            check_grammar(text, lark=True)
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(text), source)

    @classmethod
    def _checked(cls, definition: str, source: str) -> Grammar:
        _llguidance()
        error = verdict(definition)
        if error:
            what = "JSON schema" if source.startswith("json") else "grammar"
            raise EngineError(f"The {what} cannot be used: {error}")
        return cls(definition, source)


def _llguidance():
    try:
        import llguidance
    except ImportError as exc:  # a dependency of SpecChat: only a broken install lacks it
        raise EngineError(f"Structured output needs the llguidance package ({exc}): reinstall SpecChat.") from None
    return llguidance
