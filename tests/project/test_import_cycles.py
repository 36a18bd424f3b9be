"""The training package's imports, and those of saved runs and the gates, run one way: no module
imports, at any depth (module level, inside a function, under ``if TYPE_CHECKING``), a module that
imports it back. Imports are read with ``ast``, not by importing, so a cycle that Python happens
to survive today still fails here; a planted cycle in a temporary package shows the check can fail."""

from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

from helpers.paths import REPO_ROOT

SRC = REPO_ROOT / "src"


def _modules(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package (``__init__`` is the package)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def _prefixes(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _imported(node: ast.AST, module: str, is_package: bool, modules: dict) -> tuple[set[str], set[str]]:
    """The package's modules one import statement needs: (those it takes names from, those it
    only loads on the way: the parents of an imported module)."""
    if isinstance(node, ast.Import):
        loaded = set().union(*(_prefixes(alias.name) for alias in node.names))
        return set(), loaded & modules.keys()
    if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_package else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    named, loaded = set(), _prefixes(target)
    for alias in node.names:
        if f"{target}.{alias.name}" in modules:  # `from . import loops`: the submodule
            loaded |= _prefixes(f"{target}.{alias.name}")
        else:  # a name the target itself defines: it must have run that far
            named.add(target)
    return named & modules.keys(), loaded & modules.keys()


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file. A module's own parent
    packages count only where it takes a name from one (``from . import Workload``): Python
    initialises them before any submodule runs, so merely passing through them is no cycle."""
    modules = _modules(root, package)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        parents = _prefixes(module) - {module}
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                named, loaded = _imported(node, module, path.name == "__init__.py", modules)
                edges |= named | (loaded - parents)
        graph[module] = edges - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]`` starting at its first module by name, or None
    (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                ring = path[path.index(nxt):]
                first = ring.index(min(ring))
                ring = ring[first:] + ring[:first]
                return ring + [ring[0]]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def _cycle_message(package: str, cycle: list[str] | None) -> str:
    return (f"{package} imports in a circle: {' -> '.join(cycle)}. Move what both need into a module "
            f"of its own that neither imports back (or pass it in), so imports run one way") if cycle else ""


def test_the_training_package_imports_run_one_way():
    package = "ddpbench.workloads.training"
    graph = import_graph(SRC / package.replace(".", "/"), package)
    assert f"{package}.workload" in graph and f"{package}.loops" in graph[f"{package}.workload"]  # read at all
    assert _cycle_message(package, find_cycle(graph)) == ""


def test_saved_runs_the_gates_and_their_readers_import_one_way():
    # Saved runs are read and written in ddpbench.storage; the gates, the report and the history
    # read them from there, and nothing there imports a reader back.
    graph = import_graph(SRC / "ddpbench", "ddpbench")
    roles = ("ddpbench.storage", "ddpbench.gates", "ddpbench.report")
    ours = {m: {n for n in edges if n.startswith(roles)} for m, edges in graph.items() if m.startswith(roles)}
    assert "ddpbench.storage.records" in ours["ddpbench.storage.runs"]  # read at all
    assert _cycle_message("ddpbench.storage, .gates and .report", find_cycle(ours)) == ""
    assert not any(m.startswith("ddpbench.storage") and "ddpbench.gates.stored_run_gate" in edges
                   for m, edges in ours.items())


def _package(tmp_path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / "planted"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


ONE_WAY = {
    "__init__.py": "from .workload import Workload\n",
    "workload.py": "from .loops import run\nfrom . import models\n",
    "loops.py": "def run():\n    from .models import build\n    return build()\n",
    "models.py": "import os\n\ndef build():\n    return os.sep\n",
    "sub/__init__.py": "",
    "sub/helpers.py": "from ..models import build\n",
}


@pytest.mark.parametrize("planted, expected", [
    # a function-level import back into the module that imports it
    ({"models.py": "def build():\n    from .workload import Workload\n    return Workload\n"},
     "planted.loops -> planted.models -> planted.workload -> planted.loops"),
    # an import only type checkers run still ties the modules together
    ({"loops.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .workload import Workload\n"},
     "planted.loops -> planted.workload -> planted.loops"),
    # absolute, from a subpackage, and `from . import name` naming a module
    ({"models.py": "import planted.sub.helpers\n"}, "planted.models -> planted.sub.helpers -> planted.models"),
    ({"models.py": "from . import loops\n", "loops.py": "from .models import build\n"},
     "planted.loops -> planted.models -> planted.loops"),
    # a name taken from the package's __init__, which imports the module taking it
    ({"loops.py": "from . import Workload\n"},
     "planted -> planted.workload -> planted.loops -> planted"),
])
def test_a_planted_cycle_is_found_and_named(tmp_path, planted, expected):
    root = _package(tmp_path, {**ONE_WAY, **planted})
    cycle = find_cycle(import_graph(root, "planted"))
    assert " -> ".join(cycle) == expected
    assert _cycle_message("planted", cycle).startswith(f"planted imports in a circle: {expected}. Move")


def test_a_package_whose_imports_run_one_way_passes(tmp_path):
    graph = import_graph(_package(tmp_path, ONE_WAY), "planted")
    assert graph["planted.workload"] == {"planted.loops", "planted.models"}
    assert graph["planted.loops"] == {"planted.models"}  # the function-level import is seen
    assert graph["planted.sub.helpers"] == {"planted.models"}
    assert graph["planted"] == {"planted.workload"}
    assert find_cycle(graph) is None


def test_saved_runs_import_nothing_from_the_gates():
    # storage/ sits below the gates: what both need (the verdict words, a run's facts) lives in
    # ddpbench.verdict_words and ddpbench.storage.run_facts; the gates' old module paths re-export it.
    graph = import_graph(SRC / "ddpbench", "ddpbench")
    upward = {module: sorted(edge for edge in edges if edge.startswith("ddpbench.gates"))
              for module, edges in graph.items() if module.startswith("ddpbench.storage")}
    assert {module: edges for module, edges in upward.items() if edges} == {}
    assert "ddpbench.verdict_words" in graph["ddpbench.storage.records"]
    from ddpbench.gates import fingerprint, verdict_words
    from ddpbench.storage import run_facts

    assert verdict_words.Verdict.REGRESSION == "regression" and fingerprint.run_facts is run_facts.run_facts


def test_the_torch_version_and_engine_hash_are_collected_in_one_place():
    # ddpbench.identity.identity: what a worker reports, an A/B controller's own facts and a saved
    # run's facts all take their torch version and engine hash from it (three collectors before).
    import inspect

    from ddpbench.gates.ab.side_environments import local_facts
    from ddpbench.storage.run_facts import run_facts

    for collector in (local_facts, run_facts):
        text = inspect.getsource(collector)
        assert "identity(" in text and "source_digest" not in text and "torch.__version__" not in text
