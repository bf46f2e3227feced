"""The package's shape: import arrows run one way (docs/architecture.md, "Parts and arrows"), no circles, no
private name taken across modules, few modules at the top, each module says what it is for, and small pieces. Reads the source with ``ast``; imports inside functions count as much as those at the top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"

# Parts from the bottom up: a module may import its own part and any part below it, never one above. Parts on the
# same level (ui, server; base, prompts) do not import each other. `base` (paths, resources, json_files) serves every
# part but the engine and prompts; prompts (templates, thinking, tool-call formats) import nothing of ours but the engine.
LEVELS = {"engine": 0, "base": 1, "prompts": 1, "models": 2, "chat": 3, "ui": 4, "server": 4, "cli": 5, "main": 6}
TOP_MODULES = {"__init__", "__main__", "paths", "resources", "json_files"}
FORBIDDEN = {"engine": {"gradio", "fastapi", "huggingface_hub"}, "ui": {"llama_cpp"}, "server": {"llama_cpp", "gradio"},
             "chat": {"gradio"}, "models": {"gradio"},
             "prompts": {"gradio", "fastapi", "huggingface_hub", "llama_cpp"}}


def modules() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> list[str]:
    parts = ["app", *path.relative_to(APP).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def part_of(name: list[str]) -> str:
    """The part a dotted module name (app.x.y) belongs to."""
    if len(name) == 1:
        return "main"  # the app package itself
    head = name[1]
    if head in ("paths", "resources", "json_files"):
        return "base"
    if head == "__main__":
        return "main"
    return head


def imports(source: str, package: list[str]) -> list[tuple[int, str, list[str] | None]]:
    """(line, top-level package, dotted name inside app or None) for every import in ``source``, a module of
    ``package``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name.split(".")
                out.append((node.lineno, name[0], name if name[0] == "app" else None))
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            if node.module:
                out.append((node.lineno, "app", base + node.module.split(".")))
            else:  # `from . import x` imports the module x of that package
                out.extend((node.lineno, "app", base + [a.name]) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = node.module.split(".")
            out.append((node.lineno, name[0], name if name[0] == "app" else None))
    return out


def wrong_arrows(source: str, module: list[str], is_package: bool = False) -> list[str]:
    me = part_of(module)
    wrong = []
    for line, top, name in imports(source, module if is_package else module[:-1]):
        if top in FORBIDDEN.get(me, ()):
            wrong.append(f"line {line}: {me} imports {top}")
        if name is not None and (other := part_of(name)) != me and LEVELS[other] >= LEVELS[me]:
            wrong.append(f"line {line}: {me} imports {'.'.join(name)} ({other} is not below {me})")
    return wrong


def test_at_most_four_modules_directly_under_app():
    top = {p.stem for p in APP.glob("*.py")}
    assert top <= TOP_MODULES, f"modules directly under app/ beyond {sorted(TOP_MODULES)}: {sorted(top - TOP_MODULES)}"
    parts = {p.name for p in APP.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert parts <= set(LEVELS), f"packages under app/ that no layer rule covers: {sorted(parts - set(LEVELS))}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(APP)))
def test_import_arrows_run_one_way(path):
    wrong = wrong_arrows(path.read_text(encoding="utf-8"), dotted(path), path.name == "__init__.py")
    assert not wrong, f"{path.relative_to(APP)}:\n" + "\n".join(wrong)


def test_the_checker_catches_wrong_arrows():
    ui_probe = ["app", "ui", "probe"]
    assert wrong_arrows("from ..chat.runtime import Runtime\nfrom . import render\nfrom ..engine import Stats\n",
                        ui_probe) == []
    assert len(wrong_arrows("import llama_cpp\nfrom ..cli import main\nfrom ..server import api\n", ui_probe)) == 3
    engine_probe = ["app", "engine", "probe"]
    assert len(wrong_arrows("from ..paths import data_dir\nimport gradio\nfrom app.models import hub\n",
                            engine_probe)) == 3
    assert wrong_arrows("from .loop import run\nimport numpy\n", engine_probe) == []
    assert wrong_arrows("from . import starter\n", ["app", "models"], is_package=True) == []
    prompts_probe = ["app", "prompts", "probe"]
    assert wrong_arrows("from ..engine.llama import Model\nfrom .template import render_chat\nimport jinja2\n",
                        prompts_probe) == []
    assert len(wrong_arrows("from ..paths import data_dir\nfrom ..models import catalog\nfrom app.chat import remote\n"
                            "import llama_cpp\nimport gradio\n", prompts_probe)) == 5
    assert wrong_arrows("from ..prompts import chat_tokens\n", ["app", "engine", "probe"]) != []
    assert wrong_arrows("from ..prompts.tools import Tool\n", ["app", "chat", "probe"]) == []


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(APP)))
def test_every_module_says_what_it_is_for(path):
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert doc and doc.strip(), f"{path.relative_to(APP)} has no opening docstring"


def test_the_document_the_layout_cites_exists():
    doc = (APP.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "## Parts and arrows" in doc


# --- circles and private names ----------------------------------------------------------------------------------
def import_graph() -> dict[str, set[str]]:
    """Each module of app (dotted) and the modules of app it imports (a package's ``__init__`` counts as the
    package; importing a name from a package counts as importing its module when the name is one)."""
    names = {".".join(dotted(p)): p for p in modules()}
    graph = {}
    for name, path in names.items():
        package = dotted(path) if path.name == "__init__.py" else dotted(path)[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
                module = ".".join(x for x in (base, node.module or "") if x)
                targets |= {m for m in [module] + [f"{module}.{a.name}" for a in node.names] if m in names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in names}
        graph[name] = {t for t in targets if t != name and not t.startswith(name + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's strongly connected
    components of more than one module)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                group.append(w)
            on_stack.discard(v)
            if group:
                found.append(sorted(group + [v]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other_in_a_circle():
    assert circles(import_graph()) == [], "modules that import each other are one module in disguise"


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"b"}}) == []
    assert import_graph()["app.server.app"] >= {"app.server.answer", "app.server.apis.openai"}


def private_imports(source: str) -> list[str]:
    """Names starting with one underscore that ``source`` imports from a module of ours."""
    return [f"line {n.lineno}: {a.name} from {'.' * n.level}{n.module or ''}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("app"))
            for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(APP)))
def test_no_module_imports_another_modules_private_name(path):
    taken = private_imports(path.read_text(encoding="utf-8"))
    assert not taken, f"{path.relative_to(APP)} takes private names: {taken}"


def test_the_private_name_check_catches_one():
    assert private_imports("from .openai import _json_body, sse\nfrom os import _exit\nfrom . import __version__\n") \
        == ["line 1: _json_body from .openai"]


# --- sizes ------------------------------------------------------------------------------------------------------
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def oversized(path: Path) -> list[str]:
    source, rel = path.read_text(encoding="utf-8"), str(path.relative_to(APP))
    pieces = [(rel, source.count("\n"), MAX_MODULE_LINES)]
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pieces.append((f"{rel}:{n.name}", n.end_lineno - n.lineno + 1, MAX_FUNCTION_LINES))
        elif isinstance(n, ast.ClassDef):
            pieces.append((f"{rel}:{n.name}", n.end_lineno - n.lineno + 1, MAX_CLASS_LINES))
    return [f"{name} ({lines} lines; at most {limit})" for name, lines, limit in pieces if lines > limit]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(APP)))
def test_modules_classes_and_functions_stay_small(path):
    assert not oversized(path), f"over the limits: {oversized(path)}"


def test_only_the_llama_package_imports_llama_cpp():
    outside = [str(p.relative_to(APP)) for p in modules() if "llama" not in p.relative_to(APP).parts[:2]
               and any(top == "llama_cpp" for _, top, _ in imports(p.read_text(encoding="utf-8"), dotted(p)))]
    assert outside == [], f"llama_cpp imported outside app/engine/llama/: {outside}"


def string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_a_drafting_method_is_named_in_its_module_and_the_registry_only():
    """Each method's name and llama.cpp types, as literals, live in at most two files: the method's module and the
    registry. (The names of the draft model's method and of speculation off, "model" and "none", are also plain
    words of other fields — an OpenAI "model", tool_choice "none" — so only the distinctive names are counted.)"""
    from app.engine.drafters import METHODS

    names = {m.name for m in METHODS} - {"model", "none"}
    names |= {t for m in METHODS for t in m.spec_types if t != "none"}
    constants = {p: string_constants(p) for p in modules()}
    spread = {name: sorted(str(p.relative_to(APP)) for p, c in constants.items() if name in c) for name in names}
    assert {n: files for n, files in spread.items() if len(files) > 2} == {}
    assert all(files for files in spread.values()), "a method's name is not in its module: the check lost track"
