"""DESIGN's layer rule, "no module reaches into another's private members", checked on the code.

A reach is ``x._name`` where ``x`` is not the module's own ``self``/``cls`` and ``_name`` is nothing the module
itself defines (a function, class, variable, argument, or an attribute it sets on ``self``): the member belongs
to another module, of shmcoll or not. Renaming it would then fail only at run time, on whatever path reads it.
Python modules are read as ASTs; a Cython extension (its .pyx with every .pxi it includes) by its names, with
comments and strings left out. The modules whose concern is torch's internals (``torch_internals``,
``_torch_compat``: checked at group creation) and the few reaches into other libraries that have no public way
(``ALLOWED``, each with its reason) are the exceptions."""
import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "shmcoll"
EXT = REPO / "_ext"

# Modules whose concern is another library's internals: everything they read of torch is listed and checked
# when a group is made (torch_internals.CHECKS).
TORCH_INTERNALS = {"torch_internals.py", "_torch_compat.py"}

# (file, member): why the reach is the only way.
ALLOWED = {
    ("kernel_intrinsics.py", "_insert"): "llvmlite's IRBuilder has no public way to add an instruction it lacks "
                                         "(freeze)",
    ("placement/flat.py", "_allgather_base"): "torch's ProcessGroup method for all_gather_into_tensor (its name)",
    ("collectives.py", "_nnz"): "torch's sparse COO tensor API (Tensor._nnz)",
    ("sparse.py", "_nnz"): "torch's sparse COO tensor API (Tensor._nnz)",
    ("sparse.py", "_values"): "torch's sparse COO tensor API (Tensor._values)",
    ("sparse.py", "_indices"): "torch's sparse COO tensor API (Tensor._indices)",
    ("single_copy.py", "_exit"): "os._exit: a forked probe must not run the parent's exit handlers",
}
# A NamedTuple's own API begins with an underscore so as not to clash with its fields.
NAMEDTUPLE_API = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


_BY_NAME = ("getattr", "setattr", "hasattr")  # a member named by a string is a member all the same


def python_reaches(source: str) -> list[tuple[int, str]]:
    """(line, 'x._name') of each reach in a Python module's source."""
    tree = ast.parse(source)
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.alias):
            own.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BY_NAME
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            base, name = node.args[0], node.args[1].value
        else:
            continue
        if _is_private(name) and name not in own and name not in NAMEDTUPLE_API:
            found.append((node.lineno, f"{ast.unparse(base)}.{name}"))
    return found


_STRINGS = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_COMMENT = re.compile(r"#[^\n]*")


def _code_only(source: str) -> str:
    """Cython source less its strings and comments, line numbers kept."""
    blank = lambda match: re.sub(r"[^\n]", " ", match.group(0))  # noqa: E731
    return _COMMENT.sub(blank, _STRINGS.sub(blank, source))


def _by_name_as_attribute(source: str) -> str:
    """``getattr(x, "_name"...)`` written as ``x._name``, so that the string is not left out with the others."""
    return re.sub(r"\b(?:%s)\(\s*(\w+)\s*,\s*[\"'](_\w+)[\"']" % "|".join(_BY_NAME), r"\1.\2", source)


def cython_reaches(sources: list[str]) -> list[tuple[int, int, str]]:
    """(source index, line, 'x._name') of each reach in one extension's sources (a .pyx and its .pxi files)."""
    code = [_code_only(_by_name_as_attribute(source)) for source in sources]
    own = set()
    for text in code:
        own |= set(re.findall(r"(?<![\w.])(_\w+)", text))  # a bare name: declared, defined or called here
        own |= set(re.findall(r"\b(?:self|cls)\.(_\w+)", text))
    found = []
    for index, text in enumerate(code):
        for number, line in enumerate(text.splitlines(), 1):
            if re.match(r"\s*(from|c?import)\s", line):
                continue  # a module's name (shmcoll._state), not a member
            for base, name in re.findall(r"\b(\w+)\.(_\w+)", line):
                if base not in ("self", "cls") and _is_private(name) and name not in own:
                    found.append((index, number, f"{base}.{name}"))
    return found


def _package_reaches() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in TORCH_INTERNALS:
            continue
        for line, reach in python_reaches(path.read_text()):
            if (relative, reach.rsplit(".", 1)[1]) not in ALLOWED:
                problems.append(f"src/shmcoll/{relative}:{line}: {reach}")
    for pyx in sorted(EXT.glob("*.pyx")):
        files = [pyx] + [EXT / name for name in re.findall(r'^include "(\w+\.pxi)"', pyx.read_text(), re.M)]
        for index, line, reach in cython_reaches([f.read_text() for f in files]):
            problems.append(f"_ext/{files[index].name}:{line}: {reach}")
    return problems


def test_no_module_reaches_into_another_modules_private_members():
    problems = _package_reaches()
    assert not problems, ("private members read or written from outside their module (DESIGN, 'Layers'): give "
                          "their module a public method or attribute for it:\n" + "\n".join(problems))


def test_the_rule_finds_a_reach_in_python_and_in_cython():
    python = "class A:\n    def f(self, engine):\n        self._own = 1\n        return engine._queue, self._own\n"
    assert python_reaches(python) == [(4, "engine._queue")]
    assert python_reaches("import os\nos._exit(0)\nt._replace(a=1)\n") == [(2, "os._exit")]
    assert python_reaches("def f(log):\n    return getattr(log, '_cache', None)\n") == [(2, "log._cache")]
    pyx = ('cdef class B:\n    cdef object _x\n    def g(self, other):\n'
           '        """reads ``other._doc`` (a docstring: not code)"""\n'
           '        return other._pending, other._x  # other._comment\n')
    assert cython_reaches([pyx]) == [(0, 5, "other._pending")]
    assert cython_reaches(["from shmcoll._state cimport Backlog\n"]) == []
    assert cython_reaches(['def h(log):\n    return getattr(log, "_cache", None)\n']) == [(0, 2, "log._cache")]
    # a member another file of the same extension defines is its own
    assert cython_reaches(["cdef _lines(a):\n    pass\n", "x = channels._lines(1)\n"]) == []


def test_the_constants_info_prints_are_public():
    """``python -m shmcoll info`` reads the constants DESIGN names by a computed ``getattr`` (``__main__.
    named_constant``), which the AST rule above cannot see: each must be public in its module."""
    from shmcoll.__main__ import NAMED_CONSTANTS

    private = [name for name in NAMED_CONSTANTS if any(_is_private(part) for part in name.split(".")[1:])]
    assert not private, f"info reads private members of other modules: {private}"
