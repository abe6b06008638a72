"""The package's layers, checked: imports go down the layers (or stay in one), never round in a circle, and
only optional dependencies are imported inside functions. The layers are the README's "Layout"."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minigpt"

# lowest first; a module belongs to the first layer with a matching prefix
LAYERS = [
    ("model and its parts", ["device", "model", "cache", "paged", "sampling", "tokenizer", "medusa_heads", "eagle_head", "checkpoint", "kernels", "quant", "precision"]),
    ("decoding", ["decoding"]),
    ("data and training", ["data", "prompts", "streams", "training"]),
    ("the real-model track", ["real"]),
    ("measurement", ["exactness", "quality", "verdict", "roofline", "hardware", "overlap", "costs", "card", "peers", "engines", "batch_costs", "engine_compare", "bench"]),
    ("course support", ["plots", "grade", "grading", "colab"]),
]
# imported inside functions on purpose: optional extras (pip install -e ".[real]", ".[peers]", ".[test]"), so
# that the package works without them
OPTIONAL = {"transformers", "gguf", "nbformat", "nbclient", "jupyter_client", "ipykernel", "IPython.core",
            "accelerate", "llama_cpp", "llama_cpp.llama_speculative"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    sub = module.split(".")[1] if "." in module else ""
    for i, (_, prefixes) in enumerate(LAYERS):
        if sub in prefixes:
            return i
    return -1  # the package itself (minigpt/__init__.py): the public API, may import anything


def imports(module: str):
    """(line, imported name, inside a function?) for every import statement of ``module``; relative imports
    resolved to absolute names (the module, or the module's attribute's module when it is one)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((child.lineno, a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[:len(base) - (child.level - 1)]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module
                for a in child.names:
                    full = f"{name}.{a.name}"
                    out.append((child.lineno, full if full in MODULES else name, in_function))
            visit(child, inner)
    visit(tree, False)
    return out


def internal_graph() -> dict[str, set[str]]:
    return {m: {name for _, name, _ in imports(m) if name in MODULES and name != m} for m in MODULES}


def test_no_import_circles():
    graph = internal_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if n.startswith(m + "."):  # a package importing its own submodules is how packages work
                continue
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_imports_go_down_the_layers():
    wrong = []
    for m in MODULES:
        for line, name, _ in imports(m):
            if name in MODULES and layer_of(m) >= 0 and layer_of(name) > layer_of(m):
                wrong.append(f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} ({LAYERS[layer_of(m)][0]}) imports "
                             f"{name} ({LAYERS[layer_of(name)][0]})")
    assert not wrong, "\n".join(wrong)


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "minigpt" and layer_of(m) < 0] == []


def test_function_level_imports_are_only_for_optional_dependencies():
    lazy = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {name}"
            for m in MODULES for line, name, inside in imports(m)
            if inside and not any(name == o or name.startswith(o + ".") for o in OPTIONAL)]
    assert not lazy, "\n".join(lazy)
