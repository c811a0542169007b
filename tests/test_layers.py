"""hf-tpu's layers, kept so: no import circle, and every import points down the layers.

Read from the sources (every ``import`` and ``from ... import``, those inside functions included), so a lazy
import that goes the wrong way counts too. The layers, lowest first (docs/architecture.md draws them):

- base: the settings table, host facts (chips, cache directory, hooks), device-agnostic tools and the gap table;
- device: the emulator and the real wheel on XLA:CPU (each knows nothing above it);
- backend: which device this process uses, what its gaps are here;
- integrations and fixes: transformers, diffusers, accelerate, kernels, TP plans, workarounds, the fix registry;
- entry: the package root, the ``torch.backends`` autoload, the commands.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_tpu"

# module-name prefixes per layer, lowest first; a module belongs to the longest prefix that names it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("hf_tpu.settings", "hf_tpu.plumbing.chips", "hf_tpu.plumbing.cache", "hf_tpu.plumbing.import_hooks",
              "hf_tpu.plumbing.device_ready", "hf_tpu.plumbing.compile_cache", "hf_tpu.plumbing",
              "hf_tpu.recompiles", "hf_tpu.gaps")),
    ("device", ("hf_tpu.emulator", "hf_tpu.xla_cpu")),
    ("backend", ("hf_tpu.plumbing.backend", "hf_tpu.plumbing.device_hints", "hf_tpu.gaps.status",
                 "hf_tpu.compilations", "hf_tpu.collectives")),
    ("integrations", ("hf_tpu.fixes", "hf_tpu.workarounds", "hf_tpu.transformers", "hf_tpu.diffusers",
                      "hf_tpu.accelerate", "hf_tpu.kernels", "hf_tpu.tp_plans", "hf_tpu.warmup")),
    ("entry", ("hf_tpu", "hf_tpu._autoload", "hf_tpu.__main__", "hf_tpu.commands")),
)  # fmt: skip
# what the package root may hold besides sub-packages: the public API and the autoload entry point
ROOT_MODULES = {"__init__", "__main__", "_autoload", "settings", "fixes", "compilations", "recompiles",
                "collectives", "warmup"}  # fmt: skip


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if "build" in parts:  # the shipped kernel's build tree is not hf-tpu's code
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in candidates:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _layer(module: str) -> int:
    best, depth = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def test_no_import_circle():
    graph = _imports(_modules())
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_imports_point_down_the_layers():
    graph = _imports(_modules())
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_the_root_holds_the_public_api_and_the_entry_point():
    loose = {path.stem for path in PACKAGE.glob("*.py")} - ROOT_MODULES
    assert not loose, f"modules at the package root that belong in a sub-package: {sorted(loose)}"
