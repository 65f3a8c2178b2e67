"""Imports flow one way: no cycle between any modules of tfla_bench, kernels and baselines, and the
layers (one folder each) depend downwards only: what adapters build on (the model, workloads,
registry, kernels) <- the adapters <- measuring <- analysing <- the command line.

The graph holds every import statement of every module, inside functions too, read with `ast`.
Imports under `if TYPE_CHECKING:` are left out: they never run. The registry finds adapter modules
by walking their packages (`importlib` with names), which is the plug-in mechanism, not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Source folders and the package names they are installed as (pyproject's package-dir).
ROOTS = {
    "tfla_bench": REPO / "tfla_bench",
    "tfla_bench.kernels": REPO / "kernels",
    "tfla_bench.baselines": REPO / "baselines",
}
ADAPTER_PACKAGES = ("tfla_bench.kernels.adapters", "tfla_bench.baselines")
# The layers of the data flow, bottom first, as folders: every module belongs to the layer of the
# folder it sits in, so a new module needs no entry here, and a new folder must take its place below.
FOLDER_LAYERS = (
    ("adapters", "model", "kernels"),  # what adapters build on
    ("kernels.adapters", "baselines"),  # the adapters
    ("measure",),  # one case, and the machine
    ("run",),  # a sweep: spec, run directory, runner, jobs
    ("analyse", "plots"),  # finished runs
    ("cli",),  # the command line
)
# Modules at the top of `tfla_bench/`: the package itself and what every layer may use (the error
# type) sit at the bottom; the wheel builder, the kernel cache's carrier and the GPU set-up stand above
# the command line.
TOP_MODULES = {
    "tfla_bench": 0,
    "tfla_bench.errors": 0,
    "tfla_bench.cuda_wheels": len(FOLDER_LAYERS),
    "tfla_bench.gpu_setup": len(FOLDER_LAYERS),
    "tfla_bench.kernel_cache": len(FOLDER_LAYERS),
}
LAYERS = tuple(tuple(f"tfla_bench.{folder}" for folder in folders) for folders in FOLDER_LAYERS)


def module_files(roots: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name and file; a package is named by its `__init__.py`."""
    modules: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names imported anywhere in `tree` (outside `if TYPE_CHECKING:`), relative ones resolved."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
            names.append(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `roots` it imports (`from a import b` imports `a`, and `a.b` when that
    is a module)."""
    files = module_files(roots)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set()
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            if name in files:
                targets.add(name)
            elif name.rpartition(".")[0] in files and name.rpartition(".")[0] != module:
                targets.add(name.rpartition(".")[0])
        graph[module] = targets - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path `[a, b, ..., a]`, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def layer(module: str) -> int:
    """The module's layer: that of the most specific folder in `FOLDER_LAYERS` holding it, or its
    entry in `TOP_MODULES`; -1 for none."""
    if module in TOP_MODULES:
        return TOP_MODULES[module]
    found = [
        (len(package), index)
        for index, packages in enumerate(LAYERS)
        for package in packages
        if module == package or module.startswith(f"{package}.")
    ]
    return max(found)[1] if found else -1


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the data flow: a lower layer importing a higher one, or one adapter package
    importing the other against the one allowed direction (baselines may build on our mLSTM base)."""
    wrong = []
    for module, targets in graph.items():
        for target in sorted(targets):
            if layer(target) > layer(module):
                wrong.append(f"{module} -> {target}")
            elif _within(module, ("tfla_bench.kernels.adapters",)) and _within(
                target, ("tfla_bench.baselines",)
            ):
                wrong.append(f"{module} -> {target}")
    return wrong


def test_the_suite_has_no_import_cycle():
    graph = import_graph(ROOTS)
    assert "tfla_bench.measure.worker" in graph and "tfla_bench.baselines.sdpa_math" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_imports_follow_the_data_flow():
    assert upward_imports(import_graph(ROOTS)) == []


def test_every_module_has_a_layer():
    assert [module for module in import_graph(ROOTS) if layer(module) < 0] == []


def test_every_folder_of_the_suite_is_a_layer_and_few_modules_stay_at_its_top():
    folders = {path.parent.name for path in (REPO / "tfla_bench").glob("*/__init__.py")}
    assert folders == {name for names in FOLDER_LAYERS for name in names} - {
        "kernels",
        "kernels.adapters",
        "baselines",
    }
    top = {f"tfla_bench.{path.stem}".removesuffix(".__init__") for path in (REPO / "tfla_bench").glob("*.py")}
    assert top == set(TOP_MODULES) and len(top) <= 6


def test_the_worker_imports_neither_the_gate_nor_precompile():
    targets = import_graph(ROOTS)["tfla_bench.measure.worker"]
    assert not targets & {"tfla_bench.run.correctness", "tfla_bench.run.precompile"}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_worker_and_a_job_import_no_module_that_submits_jobs():
    graph = import_graph(ROOTS)
    for module in ("tfla_bench.measure.worker", "tfla_bench.run.shard"):
        assert "tfla_bench.run.cluster" not in reachable(graph, module), module
    assert "tfla_bench.run.shard" in graph["tfla_bench.run.cluster"]


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    write_package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "def late():\n    from pkg.c import thing\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\nimport pkg.a\n",
        },
    )
    cycle = find_cycle(import_graph({"pkg": tmp_path / "pkg"}))
    assert cycle == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_type_checking_imports_and_relative_imports(tmp_path):
    write_package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
            "b.py": "from . import a\nfrom .sub import c\n",
            "sub/__init__.py": "from .c import VALUE\n",
            "sub/c.py": "VALUE = 1\n",
        },
    )
    graph = import_graph({"pkg": tmp_path / "pkg"})
    assert graph == {
        "pkg": set(),
        "pkg.a": set(),
        "pkg.b": {"pkg", "pkg.a", "pkg.sub.c", "pkg.sub"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": set(),
    }
    assert find_cycle(graph) is None


@pytest.mark.parametrize(
    ("edge", "wrong"),
    [
        (("tfla_bench.adapters.registry", "tfla_bench.run.runner"), True),
        (("tfla_bench.model.counts", "tfla_bench.baselines.fa2"), True),
        (("tfla_bench.baselines.fa2", "tfla_bench.run.correctness"), True),
        (("tfla_bench.kernels.adapters.tfla_sig", "tfla_bench.baselines._attention"), True),
        (("tfla_bench.baselines.mlstm_kernels_sig", "tfla_bench.adapters.mlstm"), False),
        (("tfla_bench.run.runner", "tfla_bench.adapters.registry"), False),
        (("tfla_bench.measure.worker", "tfla_bench.run.specs"), True),
        (("tfla_bench.run.runner", "tfla_bench.analyse.report"), True),
        (("tfla_bench.analyse.report", "tfla_bench.run.runner"), False),
        (("tfla_bench.plots.style", "tfla_bench.cli.bench"), True),
    ],
)
def test_an_upward_import_is_reported(edge, wrong):
    source, target = edge
    assert bool(upward_imports({source: {target}})) is wrong
