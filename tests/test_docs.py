"""README.md and docs/: every relative link and anchor resolves, the README stays a five-minute read, each
docs/ page opens with the question it answers, and the README's map of docs/ names every page.
(The commands the pages print are checked by tests/test_commands.py; the numbers they carry from the
stand-in study by tests/test_standin_study.py.)"""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MAX_README_LINES, MAX_README_WORDS = 200, 1800


def pages() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def linking_files() -> list[str]:
    return [README] + pages() + sorted(glob.glob(os.path.join(ROOT, "results", "*", "README.md")))


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code spans blanked (a link inside code is not a link)."""
    return re.sub(r"`[^`\n]*`", "", without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation and symbols dropped, spaces to hyphens."""
    text = heading.strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(path: str) -> set[str]:
    found, seen = set(), {}
    for line in without_fences(open(path, encoding="utf-8").read()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")  # a repeated heading gets -1, -2, ...
            seen[base] = n + 1
    return found


def broken_links(path: str) -> list[str]:
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(open(path, encoding="utf-8").read())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked (no network in the tests)
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            problems.append(f"{os.path.relpath(path, ROOT)}: {target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            problems.append(f"{os.path.relpath(path, ROOT)}: {target}: no such heading")
    return problems


def test_links_and_anchors_resolve():
    """Fails on a link to a missing page or heading (checked by pointing the README at
    docs/results.md#no-such-section and at a deleted page)."""
    problems = [p for path in linking_files() for p in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_slug_matches_github():
    assert slug("Checkpoints and resume (`train_sudoku.py`, `train_fastdllm.py`)") == \
        "checkpoints-and-resume-train_sudokupy-train_fastdllmpy"
    assert slug("Seed 1 trained on to 24,000 equivalents") == "seed-1-trained-on-to-24000-equivalents"
    assert slug("Rollout and Relay (sg), seed 1") == "rollout-and-relay-sg-seed-1"


def test_readme_is_a_five_minute_read():
    """At most 200 lines and 1,800 words (wc -l, wc -w). Fails with 36 lines added (checked)."""
    text = open(README, encoding="utf-8").read()
    lines, words = text.count("\n"), len(text.split())
    assert lines <= MAX_README_LINES and words <= MAX_README_WORDS, f"README.md: {lines} lines, {words} words"


def test_each_page_opens_with_its_question():
    """The first line after a page's title is the question the page answers, in italics. Fails with the
    question line of docs/gpu.md removed (checked)."""
    missing = []
    for path in pages():
        lines = [line for line in open(path, encoding="utf-8").read().splitlines() if line.strip()]
        if not (lines[0].startswith("# ") and re.fullmatch(r"\*[^*].*\?\*", lines[1].strip())):
            missing.append(os.path.relpath(path, ROOT))
    assert not missing, f"pages that do not open with their question: {missing}"


def test_readme_maps_every_page():
    """The README's last section but the license maps docs/: every page is named there. Fails with a page
    left out of the map (checked)."""
    readme = open(README, encoding="utf-8").read()
    section = readme.split("\n## Where to read more")[1].split("\n## ")[0]
    unmapped = [os.path.basename(p) for p in pages() if f"docs/{os.path.basename(p)}" not in section]
    assert not unmapped, f"docs/ pages missing from the README's map: {unmapped}"
