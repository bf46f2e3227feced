"""The size and depth a JSON schema or a grammar may have, checked in Python before llguidance sees it, each limit
named in the refusal.

llguidance compiles grammars recursively on the calling thread's stack, with no bound of its own on some paths:
measured with llguidance 1.9.1 on an 8 MiB stack (the main thread's, and every thread's by default), a chain of
$refs kills the process (SIGSEGV) past 2,500 to 2,900 levels of nesting followed through the refs (912 links of
``{"type": "object", "properties": {"x": {"$ref": next}}}``, 2,496 of bare ``{"$ref": next}``, 138 of ten nested
objects each), and a GBNF or Lark grammar past 3,520 (GBNF) or 2,656 (Lark) rules that chain into each other, fewer
where each rule nests brackets (392 links of ten parentheses). The limits grow with the stack (64 MiB: 7,424 and
19,968 links, 28,160 GBNF rules). Converting a schema given as a Python dict recurses too (4,001 levels of JSON
passed, 10,001 crashed); a schema given as text is refused cleanly from 125 levels of JSON nesting, and a Lark rule
past about 30 nested brackets ("too deeply nested"). Other resources (long repetitions, huge enums, wide schemas)
are bounded by llguidance's own fuel and size limits: a clean error, no crash.

So every limit here sits well under those numbers, for a clear message; what keeps the process alive whatever slips
past them is ``grammar_sandbox`` (a big stack in process, a child process for anything large).
"""
from __future__ import annotations

import json
import re
from urllib.parse import unquote

from .errors import EngineError

MAX_SCHEMA_CHARS = 1_000_000  # the schema as JSON text
MAX_SCHEMA_DEPTH = 64  # JSON nesting, $refs not followed (llguidance refuses 125 and more)
MAX_SCHEMA_LEVELS = 1_000  # nesting followed through $refs (~3 KB of stack each: 8 MiB overflow from ~2,500)
MAX_GRAMMAR_CHARS = 500_000
MAX_GRAMMAR_RULES = 2_000  # a chain of rules recurses once per rule (8 MiB overflow from 2,656)
MAX_GRAMMAR_NESTING = 32  # brackets inside one rule (llguidance's Lark stops at about 30)

_DEFS = frozenset({"$defs", "definitions"})  # reached through $refs only, as llguidance compiles them


def check_schema(schema, what: str = "The JSON schema") -> str:
    """Refuse a schema past the limits (``what`` names it in the message); returns it as JSON text."""
    depth = json_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise EngineError(f"{what} nests {depth} levels deep; SpecChat accepts at most {MAX_SCHEMA_DEPTH}.")
    levels, chain = ref_levels(schema)
    if levels > MAX_SCHEMA_LEVELS:
        raise EngineError(f"{what} nests {levels} levels deep following its $refs (a chain of {chain} $refs); "
                          f"SpecChat accepts at most {MAX_SCHEMA_LEVELS}.")
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise EngineError(f"{what} is not JSON: {exc}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise EngineError(f"{what} is {len(text):,} characters long as JSON; SpecChat accepts at most "
                          f"{MAX_SCHEMA_CHARS:,}.")
    return text


def json_depth(value) -> int:
    """How deep objects and arrays nest in a JSON value (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def ref_levels(schema) -> tuple[int, int]:
    """How deep a schema nests when its local $refs are followed (a ref counts as one more level), and the longest
    chain of $refs: each object or array's height computed once, without recursing. A ref back into its own path
    (a recursive schema, a tree) ends that path, as llguidance refers to a definition it is already compiling."""
    heights: dict[int, tuple[int, int]] = {}  # id(node) -> (height, longest ref chain below)
    on_path: set[int] = set()
    resolved: dict[str, object] = {}
    stack: list[tuple[object, bool]] = [(schema, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            height, chain = 0, 0
            for child, is_ref in _edges(node, schema, resolved):
                h, c = heights.get(id(child), (0, 0))  # (a child on the path: a cycle, counted as nothing)
                height, chain = max(height, h), max(chain, c + is_ref)
            heights[key] = (height + 1, chain)
            continue
        if key in heights or key in on_path:
            continue
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in _edges(node, schema, resolved)
                     if id(child) not in heights and id(child) not in on_path)
    return heights.get(id(schema), (0, 0))


def _edges(node, root, resolved: dict) -> list[tuple[object, int]]:
    """The objects and arrays a schema node leads to: its children (definitions left out) and its $ref's target."""
    if isinstance(node, list):
        return [(child, 0) for child in node if isinstance(child, (dict, list))]
    if not isinstance(node, dict):
        return []
    out = [(child, 0) for k, child in node.items() if k not in _DEFS and isinstance(child, (dict, list))]
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref not in resolved:
            resolved[ref] = _pointer(root, ref)
        target = resolved[ref]
        if isinstance(target, (dict, list)):
            out.append((target, 1))
    return out


def _pointer(root, ref: str):
    """The value a local $ref ("#", "#/$defs/a", "#/properties/x~1y") points at, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None  # (another document, an anchor: llguidance resolves those or refuses them)
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# --- GBNF and Lark ---------------------------------------------------------------------------------------------
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*(?:\[[^\]\n]*\])?(?:\{[^}\n]*\})?[ \t]*(?:::=|:)", re.M)


def check_grammar(text: str, lark: bool, what: str = "The grammar") -> None:
    """Refuse a GBNF or Lark grammar past the limits (its size, its rules, brackets nested in a rule)."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise EngineError(f"{what} is {len(text):,} characters long; SpecChat accepts at most {MAX_GRAMMAR_CHARS:,}.")
    rules = len(_RULE.findall(text))
    if rules > MAX_GRAMMAR_RULES:
        raise EngineError(f"{what} has {rules:,} rules; SpecChat accepts at most {MAX_GRAMMAR_RULES:,}.")
    nesting = bracket_depth(text, lark)
    if nesting > MAX_GRAMMAR_NESTING:
        raise EngineError(f"{what} nests brackets {nesting} deep; SpecChat accepts at most {MAX_GRAMMAR_NESTING}.")


def bracket_depth(text: str, lark: bool) -> int:
    """How deep brackets nest in a grammar, outside its strings, comments, regular expressions (Lark) and
    character classes (GBNF, where ``[...]`` is a class; in Lark it is an optional group and counts)."""
    opening, closing = ("([{", ")]}") if lark else ("(", ")")
    quotes = "\"'" if lark else '"'
    depth = deepest = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in quotes or (lark and c == "/" and text[i + 1:i + 2] != "/") or (not lark and c == "["):
            end = {"[": "]"}.get(c, c)
            i += 1
            while i < n and text[i] != end and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
        elif (c == "#" and not lark) or (lark and text.startswith("//", i)):
            while i < n and text[i] != "\n":
                i += 1
        elif c in opening:
            depth += 1
            deepest = max(deepest, depth)
        elif c in closing:
            depth = max(0, depth - 1)
        i += 1
    return deepest
