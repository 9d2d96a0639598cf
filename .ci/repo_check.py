"""Repository check, run by CI (.ci/run) before the test suite; not part of the user-facing tests.

    python .ci/repo_check.py

The repository cites the paper and its own docs/, never notes a user does not have or issue numbers:
fails (exit 1, one line per hit) on any tracked text file with such a citation. Checked by adding
"(design note 4.1)" to model.py, and by restoring the absolute --data_path of eval_code.py's old
--canonical example.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# internal design notes, the tracker, and paths outside the repository
# and the data directory of the machines this project is developed on (a user's clone has no such path)
BANNED = re.compile(r"design note|sudoku\.md|fastdllm_v2\.md|environment\.md|style\.md|shared/design|\.\./shared|"
                    r"/work/shared|shared/data/|\bissue \d+", re.IGNORECASE)
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)


def citations() -> list[str]:
    """'path:line: text' for every line of a tracked text file that cites an internal note or an issue."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:  # not a git checkout (e.g. an exported tree): scan the working tree instead
        files = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT) if ".git" not in d for f in fs]
    hits = []
    for path in files:
        if path.endswith((".png", ".safetensors", ".gz", ".npz", ".parquet")) or path == SELF:
            continue
        try:
            text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if BANNED.search(line) and "banned" not in line and "Trap: docstrings cited" not in line \
                    and "old relay.py" not in line:
                hits.append(f"{path}:{n}: {line.strip()[:100]}")
    return hits


if __name__ == "__main__":
    hits = citations()
    if hits:
        print("files cite internal notes or issue numbers:\n" + "\n".join(hits), file=sys.stderr)
        sys.exit(1)
    print("repo check: no file cites internal notes or issue numbers")
