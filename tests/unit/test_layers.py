"""The package's import graph: no module imports one that imports it back, and every module imports alone,
in any order (docs/DESIGN.md, "Layers")."""
import ast
import pathlib
import random
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def _graph(modules) -> dict[str, set[str]]:
    """Module -> the shmcoll modules it imports anywhere (at the top or inside a function). Not the root
    package: every submodule imports its parent package as Python imports it, and ``from shmcoll import
    _reduce`` names a compiled extension."""
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shmcoll"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                deps |= subs or {node.module}
                if len(subs) < len(node.names):
                    deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("shmcoll")}
        graph[name] = {d for d in deps if d in modules and d not in (name, "shmcoll")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles = []

    def visit(node, path):
        for dep in graph[node]:
            if dep in path:
                cycles.append(path[path.index(dep):] + [dep])
            else:
                visit(dep, path + [dep])

    for start in graph:
        visit(start, [start])
    return cycles


def test_no_module_imports_one_that_imports_it_back():
    cycles = _cycles(_graph(_modules()))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])


def test_the_check_finds_a_cycle():
    assert _cycles({"backend": {"pg_bindings"}, "pg_bindings": {"backend"}, "ops": set()})
    assert not _cycles({"backend": {"ops"}, "pg_bindings": {"backend"}, "ops": set()})


def test_every_module_imports_in_any_order():
    names = sorted(_modules())
    orders = [names, names[::-1], random.Random(7).sample(names, len(names))]
    for order in orders:
        code = "import importlib\nfor name in %r:\n    importlib.import_module(name)\n" % order
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
