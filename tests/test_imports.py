"""The repository's import graph, read from the source with `ast` (nothing is imported): no module imports
itself back through others, and no internal module reaches up to an entry point.

Entry points are the scripts a user runs: the root files and scripts/ files with an `if __name__ ==
"__main__":` block (train_sudoku.py, sample.py, scripts/sudoku/standin_study.py, ...). Internal modules are
what they are built from: sudoku/, fastdllm/, the root library files (relay.py, model.py, common.py,
configurator.py) and scripts/ helpers without such a block (scripts/runs.py). Imports inside functions
count: a lazy import closes a circle as surely as one at the top. tests/, bench/ and examples/ may import
anything. Checked on the code before sudoku/step.py and scripts/sudoku/standin_protocol.py existed: it named
both circles (sudoku.cuda_graph -> train_sudoku -> sudoku.cuda_graph, and scripts.sudoku.standin_report <->
scripts.sudoku.standin_study) and the arrows up from sudoku.cuda_graph and scripts.runs to train_sudoku.
"""
import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERNAL_PACKAGES = ("sudoku", "fastdllm")
FREE = ("tests", "bench", "examples")  # may import anything (nothing imports them)


def python_files() -> list[str]:
    """Repository-relative paths of the tracked and untracked-but-not-ignored .py files."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True).stdout.split()
    if listed:
        return sorted(p for p in set(listed) if os.path.exists(os.path.join(ROOT, p)))
    return sorted(os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, fs in os.walk(ROOT)
                  if not any(part.startswith(".") for part in os.path.relpath(d, ROOT).split(os.sep)[1:] or [""])
                  for f in fs if f.endswith(".py"))


def module_name(path: str) -> str:
    name = path[:-3].replace(os.sep, ".").replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def imported_names(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every dotted name an import statement anywhere in the file (functions included) may load;
    `from a import b` gives both a.b (b may be a submodule) and a. Relative imports are resolved."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, str]]:
    """({module: the repository modules it imports}, {module: its path})."""
    paths = {module_name(p): p for p in python_files()}
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
        edges = set()
        for name in imported_names(tree, module, path.endswith("__init__.py")):
            parts = name.split(".")
            # the longest prefix that is a repository module (`import sudoku.board` loads sudoku/board.py)
            found = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in paths), None)
            if found is not None and found != module:
                edges.add(found)
        graph[module] = edges
    return graph, paths


def has_main_block(path: str) -> bool:
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def is_entry_point(module: str, path: str) -> bool:
    top = module.split(".")[0]
    return (module.count(".") == 0 or top == "scripts") and top not in FREE and has_main_block(path)


def is_internal(module: str, path: str) -> bool:
    top = module.split(".")[0]
    if top in INTERNAL_PACKAGES:
        return True
    return (module.count(".") == 0 or top == "scripts") and top not in FREE and not has_main_block(path)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (as a path back to its start) per strongly connected group of modules (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(set(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [circle_through(graph, group) for group in groups]


def circle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path from the group's first module back to itself, inside the group (breadth first: a short one)."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError(f"no circle through {start}")  # cannot happen in a strongly connected group


def test_no_module_imports_itself_back():
    """Fails on any circle of imports between the repository's modules, e.g. a lazy `import train_sudoku`
    in sudoku/cuda_graph.py (checked: it names that circle)."""
    graph, _ = import_graph()
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_internal_module_imports_an_entry_point():
    """Fails when sudoku/, fastdllm/, a root library file or a scripts/ helper imports a script a user runs
    (checked with scripts/runs.py's former `from train_sudoku import TrainConfig`)."""
    graph, paths = import_graph()
    entry = {m for m, p in paths.items() if is_entry_point(m, p)}
    wrong = [f"{m} imports the entry point {e}" for m in sorted(graph) if is_internal(m, paths[m])
             for e in sorted(graph[m] & entry)]
    assert not wrong, "\n".join(wrong)


def test_the_graph_sees_what_it_checks():
    """The reading itself: the known entry points and internal modules are classified as such, lazy and
    relative imports are edges, and a made-up circle is found (so a passing check is not a blind one)."""
    graph, paths = import_graph()
    for m in ("train_sudoku", "sample", "prepare_data", "quickstart", "eval_code", "train_fastdllm",
              "scripts.sudoku.standin_study", "scripts.sudoku.standin_report"):
        assert is_entry_point(m, paths[m]), m
    for m in ("relay", "model", "common", "configurator", "scripts.runs", "sudoku.board", "fastdllm.generate",
              "fastdllm.chat"):
        assert is_internal(m, paths[m]), m
    assert "sudoku.board" in graph["sudoku.decode"] and "relay" in graph["model"]
    tree = ast.parse("def f():\n    from . import cache\n    from .graphs import x\n    import relay\n")
    assert imported_names(tree, "fastdllm.generate", False) >= {"fastdllm.cache", "fastdllm.graphs", "relay"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
