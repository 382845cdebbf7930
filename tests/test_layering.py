"""Dependencies point one way.

cli -> pipeline -> (checks, convert) -> mapping -> (families, formats); families -> params
(logical parameters); mapping, checks, pipeline and cli -> layouts (whose modules saved a
Megatron checkpoint); checks -> writers (tools known to drop the MTP layer); all -> model,
errors, dtypes, chunks;
cli -> accept -> (families, formats); accept and convert -> torch_threads (torch's CPU threads);
report sees only the model. Heavy third-party imports are confined to the layers listed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "mtpcheck"

# layer -> mtpcheck layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "chunks": set(),
    "dtypes": set(),
    "errors": set(),
    "units": set(),
    "layouts": set(),
    "writers": set(),
    "settings": {"errors"},
    "declared": {"errors"},
    "torch_threads": {"errors", "settings"},
    "extras": {"errors"},
    "ticker": {"units", "settings"},
    "formats": {"model", "errors", "dtypes", "chunks", "units"},
    "params": {"model", "dtypes", "units"},
    "families": {"model", "errors", "dtypes", "params"},
    "mapping": {"layouts", "model", "errors", "dtypes", "chunks", "families", "params", "units"},
    "checks": {
        "declared",
        "settings",
        "layouts",
        "writers",
        "model",
        "errors",
        "dtypes",
        "chunks",
        "families",
        "mapping",
        "params",
        "units",
    },
    "convert": {
        "model",
        "errors",
        "dtypes",
        "families",
        "mapping",
        "formats",
        "ticker",
        "params",
        "torch_threads",
    },
    "pipeline": {
        "declared",
        "settings",
        "layouts",
        "model",
        "errors",
        "formats",
        "families",
        "mapping",
        "checks",
        "convert",
        "units",
        "ticker",
        "params",
    },
    "report": {"model", "errors", "units", "__init__"},
    "accept": {
        "declared",
        "settings",
        "model",
        "errors",
        "dtypes",
        "families",
        "formats",
        "ticker",
        "params",
        "torch_threads",
        "units",
    },
    "api": {
        "declared",
        "layouts",
        "model",
        "errors",
        "extras",
        "formats",
        "checks",
        "pipeline",
        "accept",
    },
    "testing": {"api", "model", "extras", "families", "convert"},
    "cli": {
        "declared",
        "settings",
        "api",
        "dtypes",
        "layouts",
        "model",
        "errors",
        "formats",
        "checks",
        "report",
        "pipeline",
        "convert",
        "accept",
        "units",
        "ticker",
        "extras",
        "__init__",
    },
    "__main__": {"cli"},
    # the public API, imported on first use
    "__init__": {"api", "testing", "model", "errors", "extras"},
}
# third-party modules a layer may import
THIRD_PARTY: dict[str, set[str]] = {
    # huggingface_hub: hf:// inputs only; msgspec: the typed JSON decoding of headers and index
    # no torch: Megatron's pickles are read with stand-ins (formats/torch_pickle.py), their
    # tensors mapped with numpy (formats/torch_save_file.py); the core install has no torch
    "formats": {"numpy", "yaml", "huggingface_hub", "msgspec"},
    "report": {"rich"},
    "cli": {"click", "rich"},  # rich: the live progress bar (cli/stderr_log.py)
    "checks": {"numpy"},
    "mapping": {"numpy"},
    "convert": {"numpy", "torch", "megatron", "transformers", "safetensors"},
    "pipeline": {"torch"},  # torch.distributed, only under torchrun (pipeline/distributed.py)
    "accept": {"torch", "transformers", "numpy", "matplotlib"},
    "torch_threads": {"torch"},  # sets torch's CPU threads, for accept and convert
}
STDLIB_ONLY_OR_LISTED = {
    "click",
    "rich",
    "numpy",
    "torch",
    "transformers",
    "megatron",
    "safetensors",
    "matplotlib",
    "huggingface_hub",
    "msgspec",
}


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "mtpcheck":
                found.update(f"mtpcheck.{a.name}" for a in node.names)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_respect_layers(path: Path) -> None:
    layer = _layer(path)
    for name in _imports(path):
        top, _, rest = name.partition(".")
        if top == "mtpcheck":
            target = rest.split(".")[0] or "__init__"
            if target in {"__version__"}:
                target = "__init__"
            assert target == layer or target in ALLOWED[layer], f"{layer} imports {name}"
        elif top in STDLIB_ONLY_OR_LISTED:
            assert top in THIRD_PARTY.get(layer, set()), f"{layer} imports {name}"


STDLIB_ONLY: dict[str, set[str]] = {
    # the torch_dist key scheme, which the reader and the writer share
    "formats/torch_dist_keys.py": {"mtpcheck.errors", "mtpcheck.model"},
}
"""Modules that import only the standard library and these mtpcheck modules, anywhere in them."""


@pytest.mark.parametrize("module", sorted(STDLIB_ONLY))
def test_stdlib_only_modules(module: str) -> None:
    for name in _imports(PACKAGE / module):
        if name.startswith("mtpcheck"):
            assert name in STDLIB_ONLY[module], f"{module} imports {name}"
        else:
            assert name.split(".")[0] in sys.stdlib_module_names, f"{module} imports {name}"


def test_vllm_driver_needs_nothing_but_vllm() -> None:
    """The driver runs in vLLM's interpreter (``accept --vllm-python``), where mtpcheck and its
    dependencies may be absent: the standard library and vLLM only."""
    for name in _imports(PACKAGE / "accept" / "vllm_driver.py"):
        top = name.split(".")[0]
        assert top == "vllm" or top in sys.stdlib_module_names, f"vllm_driver imports {name}"


def test_every_module_is_in_a_known_layer() -> None:
    assert {_layer(p) for p in MODULES} <= set(ALLOWED)


def test_rule_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from mtpcheck.cli import main\nimport torch\n")
    assert _imports(bad) == {"mtpcheck.cli", "torch"}
    assert "cli" not in ALLOWED["families"] and "torch" not in THIRD_PARTY.get("families", set())


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _mtpcheck_imports(path: Path) -> set[str]:
    """The mtpcheck modules ``path`` imports, anywhere in it (lazy imports in functions and
    ``if TYPE_CHECKING:`` blocks too: a circle through them is a circle all the same)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mtpcheck"):
            # ``from package import submodule`` imports the submodule, not the package
            submodules = {f"{node.module}.{a.name}" for a in node.names} & KNOWN
            found.update(submodules or {node.module})
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mtpcheck"))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle of ``graph``, each as the modules on it."""
    cycles, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state[target] == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif state[target] == 0:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [module])
    return cycles


KNOWN = {_module_name(p) for p in MODULES}


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = {_module_name(p): _mtpcheck_imports(p) for p in MODULES}
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


MAX_LINES = 600
"""Past this a module is doing several jobs: split it by job, as accept/ is split."""


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_a_screenful_of_jobs(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


MAX_FUNCTION_LINES = 80
"""Past this a function answers several questions: split it along them."""


def _long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function in ``source`` longer than :data:`MAX_FUNCTION_LINES`,
    its decorators left out, nested functions counted within their parent too."""
    return [
        (node.name, lines)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_it_can_be_followed(path: Path) -> None:
    assert _long_functions(path.read_text()) == []


def test_long_function_rule_counts_lines() -> None:
    body = "\n".join(f"    x{j} = {j}" for j in range(MAX_FUNCTION_LINES))
    assert _long_functions(f"def long():\n{body}\n") == [("long", MAX_FUNCTION_LINES + 1)]
    assert _long_functions(f"def short():\n{body[: body.rindex(chr(10))]}\n") == []
