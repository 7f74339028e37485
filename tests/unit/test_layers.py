"""The package's import graph against docs/DESIGN.md's layer map: every module is on the map, no import
climbs to a line above its own, none closes a cycle, nothing under the map's torch line imports torch, and
every module imports alone, in any order."""
import ast
import pathlib
import random
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SRC = REPO / "src"
DESIGN = REPO / "docs" / "DESIGN.md"
TORCH_LINE = "nothing below imports torch"


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def _layer_map(text: str) -> tuple[dict[str, int], int]:
    """Module -> its line in DESIGN's map (a folder's modules share the folder's line), and the torch line.

    The map is the first fenced block after "## Layers": a line names modules (``name.py``) or opens a
    folder (``name/`` first on the line); the lines indented under a folder are its contents."""
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    layers, folder, torch_line = {}, None, None
    for number, line in enumerate(block.splitlines()):
        if TORCH_LINE in line:
            torch_line = number
            continue
        text_part = re.sub(r"^[\s|v]*", "", line)
        indent = len(line) - len(line.lstrip(" "))
        opened = re.match(r"(\w+)/\s", text_part + " ")
        if indent == 0 and opened:
            folder = (opened.group(1), number)
            if folder[0] != "_ext":
                layers[f"shmcoll.{folder[0]}"] = number
            continue
        if indent == 0 or line.lstrip().startswith("|"):
            folder = None
        for name in re.findall(r"(?<![\w/.])(\w+)\.py\b", text_part):
            if folder and folder[0] == "_ext":
                continue
            if folder:
                package = "shmcoll." + folder[0]
                layers[package if name == "__init__" else f"{package}.{name}"] = folder[1]
            else:
                layers[f"shmcoll.{name}"] = number
    return layers, torch_line


def _layer_of(module: str, layers: dict[str, int]) -> int | None:
    """A module's line: its own, else its nearest listed folder's (placement.across.shape: placement/)."""
    while module not in layers and "." in module:
        module = module.rsplit(".", 1)[0]
    return layers.get(module)


def _imports_torch(path: pathlib.Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def _map_violations(modules, graph, layers, torch_line) -> list[str]:
    problems = []
    for name in sorted(modules):
        if name == "shmcoll":
            continue
        line = _layer_of(name, layers)
        if line is None:
            problems.append(f"{name} is not on the layer map")
            continue
        if line > torch_line and _imports_torch(modules[name]):
            problems.append(f"{name} is under the torch line but imports torch")
        for dep in sorted(graph[name]):
            dep_line = _layer_of(dep, layers)
            if dep_line is not None and dep_line <= line and dep_line != line:
                problems.append(f"{name} (line {line}) imports {dep} (line {dep_line}), which is not below it")
            elif dep_line == line and name.split(".")[:2] != dep.split(".")[:2]:
                problems.append(f"{name} imports {dep} on its own line; only a folder's modules may")
    return problems


def _graph(modules) -> dict[str, set[str]]:
    """Module -> the shmcoll modules it imports anywhere (at the top or inside a function). Not the root
    package: every submodule imports its parent package as Python imports it, and ``from shmcoll import
    _schedules`` names a compiled extension."""
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
    assert _cycles({"backend": {"process_group"}, "process_group": {"backend"}, "ops": set()})
    assert not _cycles({"backend": {"ops"}, "process_group": {"backend"}, "ops": set()})


def test_the_code_keeps_to_the_layer_map():
    modules = _modules()
    layers, torch_line = _layer_map(DESIGN.read_text())
    assert torch_line is not None, f"no line with {TORCH_LINE!r} in DESIGN's map"
    problems = _map_violations(modules, _graph(modules), layers, torch_line)
    assert not problems, "docs/DESIGN.md's layer map and the code disagree:\n" + "\n".join(problems)


def test_the_map_check_finds_a_climb_a_missing_module_and_torch_below_the_line(tmp_path):
    text = "## Layers\n```\ncollectives.py\n  ---- nothing below imports torch ----\narena.py\n```\n"
    layers, torch_line = _layer_map(text)
    assert layers == {"shmcoll.collectives": 1, "shmcoll.arena": 3} and torch_line == 2
    uses_torch = tmp_path / "arena.py"
    uses_torch.write_text("import torch\n")
    plain = tmp_path / "plain.py"
    plain.write_text("")
    modules = {"shmcoll.collectives": plain, "shmcoll.arena": uses_torch, "shmcoll.lost": plain}
    graph = {"shmcoll.collectives": set(), "shmcoll.arena": {"shmcoll.collectives"}, "shmcoll.lost": set()}
    problems = _map_violations(modules, graph, layers, torch_line)
    assert any("lost is not on the layer map" in p for p in problems), problems
    assert any("arena is under the torch line" in p for p in problems), problems
    assert any("shmcoll.arena (line 3) imports shmcoll.collectives" in p for p in problems), problems


def test_every_module_imports_in_any_order():
    names = sorted(_modules())
    orders = [names, names[::-1], random.Random(7).sample(names, len(names))]
    for order in orders:
        code = "import importlib\nfor name in %r:\n    importlib.import_module(name)\n" % order
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
