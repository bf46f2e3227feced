"""Grammars that constrain an answer (a JSON schema, any JSON object, llama.cpp's GBNF, a Lark grammar), compiled
and checked by llguidance before a generation starts, so a bad one is refused with the library's own words.

JSON is laid out as ``json.dumps`` writes it (", " and ": ", no other whitespace): fixed separators are what let
the grammar force whole runs of keys and punctuation (drafted free, see ``constraint``), and they keep a model from
padding an answer with whitespace for ever, which a whitespace-flexible grammar allows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import EngineError

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
        if not isinstance(schema, (dict, bool)):
            raise EngineError("A JSON schema must be an object (or true/false).")
        try:
            definition = _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
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
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(text)
        except Exception as exc:  # the converter's own parse errors
            raise EngineError(f"The grammar is not valid GBNF: {exc}") from None
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(lark), "gbnf")

    @classmethod
    def lark(cls, text: str, source: str = "lark") -> Grammar:
        """llguidance's Lark (what tool-call grammars are written in: ``%json`` embeds a schema)."""
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(text), source)

    @classmethod
    def _checked(cls, definition: str, source: str) -> Grammar:
        error = _llguidance().LLMatcher.validate_grammar(definition)
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
