"""Tracked files hold no data the repository may not copy (larsdoku's Top1465 puzzles). (That no file
cites internal notes is a repository check CI runs: .ci/repo_check.py.)"""
import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_tracked_file_holds_larsdoku_puzzles():
    """larsdoku is AGPL: its puzzles are read from the installed package, never copied into the tree.
    Fails on a tracked file holding any Top1465 puzzle in either blank notation (checked by pasting one
    into a test file). Skipped without the package."""
    import sudoku.hard
    try:
        puzzles = sudoku.hard.top1465_questions()
    except sudoku.hard.MissingPackage as e:
        import pytest
        pytest.skip(str(e))
    wanted = set(puzzles) | {p.replace(".", "0") for p in puzzles}
    # Peter Norvig's well-known example of a hard puzzle (his 2006 essay) is Top1465's first puzzle too;
    # the repository uses it as his example, not as larsdoku's data
    norvig = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"
    wanted -= {norvig, norvig.replace(".", "0")}
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    hits = []
    for path in files:
        try:
            text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found = set(re.findall(r"[0-9.]{81}", text)) & wanted
        hits += [f"{path}: {p}" for p in sorted(found)]
    assert not hits, "\n".join(hits[:10])


def test_test_files_share_only_through_helpers():
    """What several test files use lives in tests/helpers.py: no test file imports another test file
    (checked with test_sampler_knobs.py's earlier `from test_sample import ...`)."""
    import ast
    tests = os.path.join(ROOT, "tests")
    hits = []
    for name in sorted(os.listdir(tests)):
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(tests, name)).read())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            hits += [f"tests/{name}:{node.lineno}: imports {m}" for m in modules
                     if m.split(".")[0].startswith(("test_", "conftest")) or m.startswith("tests.test_")]
    assert not hits, "\n".join(hits)


def test_kept_results_name_no_machines_directories():
    """Kept results (results/**/*.json) record paths relative to the repository, so they read the same on
    every clone (checked with one file's "data_dir" put back to the absolute path of the machine that ran it)."""
    import json
    hits = []

    def walk(value, where):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and os.path.isabs(value):
            hits.append(f"{where}: {value}")
    for path in glob.glob(os.path.join(ROOT, "results", "**", "*.json"), recursive=True):
        with open(path) as f:
            walk(json.load(f), os.path.relpath(path, ROOT))
    assert not hits, "\n".join(hits[:10])
