"""The package's shape, from its imports (stdlib ast only, no module is imported): no import circles,
the sandbox imports nothing of the grader's (autograder/sandbox/__init__.py states the rule), the
core imports no adapter (autograder/adapters/__init__.py), except `python -m autograder`'s lazy dispatch,
the checking machinery every lesson shares imports no lesson's package, and no module takes another's
internals (a `_name`). Imports inside functions count: a lazy import still makes a circle."""

import ast
import sys
import textwrap
from pathlib import Path

AUTOGRADER = Path(__file__).resolve().parents[2] / "autograder"
SANDBOX, ADAPTERS, CLI = "autograder.sandbox", "autograder.adapters", "autograder.__main__"
CHECKING, LESSONS = "autograder.checking", "autograder.lessons"


def module_name(path, root):
    """autograder/sandbox/server.py -> autograder.sandbox.server; a package's __init__.py -> the package."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse(root):
    """{module: (syntax tree, [(node, [(imported module, bound name, name taken)])])} for every module
    under the package `root`. `from P import name` imports the module P.name when that is one of ours,
    else P (name taken: name); `import a.b as c` imports a.b (bound name c)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}
    found = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        nodes = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                nodes.append((node, [(a.name, a.asname or a.name.partition(".")[0], None) for a in node.names]))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                nodes.append(
                    (
                        node,
                        [
                            (f"{base}.{a.name}", a.asname or a.name, None)
                            if f"{base}.{a.name}" in files
                            else (base, a.asname or a.name, a.name)
                            for a in node.names
                        ],
                    )
                )
        found[name] = tree, nodes
    return found


def imports(root):
    """{module: [(imported module, line, inside a function)]} for every module under the package `root`."""
    found = {}
    for name, (tree, nodes) in parse(root).items():
        lazy = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)
            if n is not f
        }
        found[name] = [(t, node.lineno, id(node) in lazy) for node, targets in nodes for t, _, _ in targets if t]
    return found


def ours(target, modules):
    """The module of ours that importing `target` runs last (its longest prefix among `modules`), or None."""
    parts = target.split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None)


def circles(graph):
    """Every import circle, as a list of modules (Tarjan's strongly connected components)."""
    modules = set(graph)
    edges = {m: sorted({o for t, _, _ in graph[m] if (o := ours(t, modules)) and o != m}) for m in graph}
    index, low, stack, on, found = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        on.add(m)
        for n in edges[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while not component or component[-1] != m:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def is_under(name, package):
    return name == package or name.startswith(package + ".")


def sandbox_breaches(graph):
    """Imports from the sandbox of solutions/ or of any autograder module outside the sandbox."""
    return [
        f"{m}:{line} imports {t}"
        for m, edges in graph.items()
        if is_under(m, SANDBOX)
        for t, line, _ in edges
        if is_under(t, "solutions") or (is_under(t, "autograder") and not is_under(t, SANDBOX))
    ]


def core_imports_of_adapters(graph):
    """Imports of an adapter from a core module; the CLI's dispatch may import one inside a function."""
    return [
        f"{m}:{line} imports {t}"
        for m, edges in graph.items()
        if not is_under(m, ADAPTERS)
        for t, line, lazy in edges
        if is_under(t, ADAPTERS) and not (m == CLI and lazy)
    ]


def checking_imports_of_lessons(graph):
    """Imports of a lesson's package (autograder.lessons.<module>) from the machinery every lesson shares
    (autograder.checking): a lesson builds on it, never the reverse (the registry finds a lesson's checks by name)."""
    return [
        f"{m}:{line} imports {t}"
        for m, edges in graph.items()
        if is_under(m, CHECKING)
        for t, line, _ in edges
        if is_under(t, LESSONS) and t != LESSONS
    ]


def private(name):
    return name.startswith("_") and not name.startswith("__")


def private_uses(root):
    """Where a module of ours takes another's internals: `from autograder.x import _name`, or `m._name`
    for a module `m` of ours it imported (an adapter uses the core's public functions, never its internals)."""
    found = []
    for name, (tree, nodes) in parse(root).items():
        modules = set()  # the names this module binds to modules of ours
        for node, targets in nodes:
            for target, bound, taken in targets:
                if not is_under(target, root.name):
                    continue
                if taken is None:
                    modules.add(bound)
                elif private(taken):
                    found.append(f"{name}:{node.lineno} imports {target}.{taken}")
        found += [
            f"{name}:{n.lineno} uses {n.value.id}.{n.attr}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in modules
            and private(n.attr)
        ]
    return found


GRAPH = imports(AUTOGRADER)


def test_no_import_circles():
    assert not circles(GRAPH), "import circles: " + "; ".join(" -> ".join(c) for c in circles(GRAPH))


def test_the_sandbox_imports_nothing_of_the_grader():
    assert any(is_under(m, SANDBOX) for m in GRAPH)
    assert not sandbox_breaches(GRAPH), sandbox_breaches(GRAPH)


def test_the_core_imports_no_adapter():
    assert any(is_under(m, ADAPTERS) for m in GRAPH)
    assert not core_imports_of_adapters(GRAPH), core_imports_of_adapters(GRAPH)


def test_the_shared_checking_imports_no_lesson():
    assert any(is_under(m, CHECKING) for m in GRAPH) and any(m.startswith(LESSONS + ".") for m in GRAPH)
    assert not checking_imports_of_lessons(GRAPH), checking_imports_of_lessons(GRAPH)


def test_no_module_takes_another_modules_internals():
    assert not private_uses(AUTOGRADER), private_uses(AUTOGRADER)


def planted(tmp_path, files):
    root = tmp_path / "autograder"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return imports(root)


def test_the_checks_see_planted_breaches(tmp_path):
    graph = planted(
        tmp_path,
        {
            "__init__.py": "",
            "__main__.py": "def main():\n    from autograder.adapters import lms\n",
            "report.py": "from autograder import results\ndef write():\n    from autograder.adapters.lms import up\n",
            "results.py": "import json\n",
            "adapters/__init__.py": "",
            "adapters/lms.py": "from autograder.report import write\n",
            "sandbox/__init__.py": "",
            "sandbox/helpers.py": "def ask():\n    from .server import call\n",
            "sandbox/server.py": "from . import helpers, wire\nimport solutions.attention\n",
            "sandbox/wire.py": "from autograder.checking import LESSONS\n",
            "lessons/__init__.py": "",
            "lessons/toy/__init__.py": "",
            "lessons/toy/checks.py": "from autograder import checking\n",
            "checking/__init__.py": "from autograder import lessons\n",
            "checking/registry.py": "def find():\n    from autograder.lessons.toy import checks\n",
        },
    )
    assert circles(graph) == [
        ["autograder.adapters.lms", "autograder.report"],
        ["autograder.sandbox.helpers", "autograder.sandbox.server"],
    ]
    assert sandbox_breaches(graph) == [
        "autograder.sandbox.server:2 imports solutions.attention",
        "autograder.sandbox.wire:1 imports autograder.checking",
    ]
    assert core_imports_of_adapters(graph) == ["autograder.report:3 imports autograder.adapters.lms"]
    assert checking_imports_of_lessons(graph) == [
        "autograder.checking.registry:2 imports autograder.lessons.toy.checks"
    ]
    internals = planted(
        tmp_path / "internals",
        {
            "__init__.py": "",
            "results.py": "def _check(): pass\n",
            "export.py": "from autograder.results import _check\n"
            "from autograder import results as store\nstore._check()\n",
        },
    )
    assert private_uses(tmp_path / "internals" / "autograder") == [
        "autograder.export:1 imports autograder.results._check",
        "autograder.export:3 uses store._check",
    ]
    assert internals["autograder.export"]  # the planted tree was read
    # and a tree without them passes
    clean = planted(
        tmp_path / "clean", {"__init__.py": "", "a.py": "from autograder import b\n", "b.py": "import os\n"}
    )
    assert circles(clean) == [] and sandbox_breaches(clean) == [] and core_imports_of_adapters(clean) == []
    assert checking_imports_of_lessons(clean) == []
    assert private_uses(tmp_path / "clean" / "autograder") == []
