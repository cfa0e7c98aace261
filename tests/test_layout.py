"""The package's layout: no import circles, and each concept in the folder its name announces."""

import ast
import pathlib

import rnngrad
from rnngrad import registry

ROOT = pathlib.Path(rnngrad.__file__).resolve().parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    """{module name: path} of every Python module of the package."""
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def import_graph() -> dict:
    """{module: {rnngrad modules it imports}}, counting every import statement in the file
    (those inside functions too: an import deferred to break a circle is still a circle)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                # `from pkg import sub` imports the submodule; `from pkg import name` the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict):
    """One import circle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
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


def test_find_cycle_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle_in_the_package():
    graph = import_graph()
    assert "rnngrad.testing.vectors" in graph and "rnngrad.testing.check" in graph["rnngrad.testing.vectors"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_checker_and_the_golden_vectors_depend_one_way():
    graph = import_graph()
    assert "rnngrad.testing.check" in graph["rnngrad.testing.vectors"]
    assert "rnngrad.testing.vectors" not in graph["rnngrad.testing.check"]


def test_every_backend_lives_under_rnngrad_backends():
    for spec in registry._SPECS:
        assert spec.module.startswith("rnngrad.backends."), spec


def test_every_verification_module_imports():
    """The scripts of verification/ import what they use from where it lives now."""
    import importlib

    folder = ROOT.parent / "verification"
    names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__main__")
    assert "check_finite_differences" in names
    for name in names:
        importlib.import_module(f"verification.{name}")
