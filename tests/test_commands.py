"""Every `python ...` command printed in README.md and docs/*.md names a script that exists and flags it accepts.

The commands are read from fenced code blocks and inline code, split at shell operators (&&, ;, |, &),
line continuations joined. For each repository script (a file, or `python -m pkg.module`) that parses
its arguments with argparse or configurator, a probe subprocess runs it with its parser intercepted: `configurator.load_config` reports the config
dataclass' fields, `argparse.ArgumentParser.parse_args` reports the parser's option strings; nothing
past the parsing runs, so no command is really executed. A script that reads sys.argv by hand is not
run: its flags must appear in its source. Positional config/*.py files must exist, and a path into a
run's out_dir (out/<run>/<name>) must name what a trainer writes there (its RUN_FILES).
`torchrun ... script.py` commands are checked like `python script.py`.

Beyond reading their flags, every documented script with a parser is run for real with `--help` (a subprocess
each, as a user would type it: a moved or renamed script, or one that no longer starts, fails it), and every
`bash X.sh` in the docs must name a file.
"""
import ast
import fnmatch
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTERNAL_MODULES = {"pytest", "pip", "venv", "torch.distributed.run", "http.server"}  # -m targets not in the repo
OPERATORS = {"&&", "||", ";", "|", "&", ";;", "(", ")", ">", ">>", "<", "2>", "2>&1"}


def doc_files() -> list[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def code_snippets(text: str) -> list[str]:
    """Fenced code blocks (continuation lines joined) and inline code spans, outside the fences."""
    fences = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    snippets = [line for block in fences.findall(text) for line in block.replace("\\\n", " ").splitlines()]
    snippets += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", fences.sub("", text))]
    return snippets


def commands(snippet: str) -> list[list[str]]:
    """The argument lists after each `python`/`torchrun` in a shell line: [script or -m module, args...]."""
    lex = shlex.shlex(snippet.split(" #")[0], posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: prose, not a command
        return []
    found = []
    for i, tok in enumerate(tokens):
        if tok not in ("python", "python3", "torchrun"):
            continue
        args = []
        for t in tokens[i + 1:]:
            if t in OPERATORS or t in ("do", "done", "then"):
                break
            args.append(t.strip("[]"))  # [--optional=flags] in usage lines
        if tok == "torchrun":  # its own options come first, then the script
            args = args[next((j for j, a in enumerate(args) if a.endswith(".py")), len(args)):]
        elif args[:1] == ["-m"]:
            args = ["-m " + args[1]] + args[2:] if len(args) > 1 else []
        if args and (args[0].startswith("-m ") or not args[0].startswith("-")):  # not python -c / python - <<EOF
            found.append(args)
    return found


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, [target, args...]) for every command in the docs whose target is in the repository."""
    out = []
    for path in doc_files():
        for snippet in code_snippets(open(path, encoding="utf-8").read()):
            for cmd in commands(snippet):
                if cmd[0].startswith("-m ") and cmd[0][3:] in EXTERNAL_MODULES:
                    continue
                out.append((f"{os.path.relpath(path, ROOT)}: {' '.join(cmd)}", cmd))
    return out


def target_path(target: str) -> str:
    """The file a target runs: `scripts/x.py`, or `-m pkg.mod` as pkg/mod.py or pkg/mod/__main__.py."""
    if not target.startswith("-m "):
        return os.path.join(ROOT, target)
    base = os.path.join(ROOT, *target[3:].split("."))
    return base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__main__.py")


def probe_flags(targets: list[str]) -> dict[str, dict]:
    """Run the probe (this file as a script) once over every target: {target: {"flags": [...]} or {"error": ...}}."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), *targets], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def parses_with_a_parser(path: str) -> bool:
    """Only scripts that parse through argparse or configurator are probed: another script would run for real."""
    return re.search(r"\bargparse\b|\bload_config\(", open(path, encoding="utf-8").read()) is not None


def command_problems(cmds: list[tuple[str, list[str]]]) -> list[str]:
    problems, probed_uses = [], {}
    for where, cmd in cmds:
        path = target_path(cmd[0])
        if not os.path.isfile(path):
            problems.append(f"{where}\n    no such script: {cmd[0]}")
        elif parses_with_a_parser(path):
            probed_uses.setdefault(cmd[0], []).append((where, cmd))
        else:  # a hand-parsed command line (sys.argv): its flags must at least be in its source
            source = open(path, encoding="utf-8").read()
            problems += [f"{where}\n    {cmd[0]} never mentions {arg}" for arg in cmd[1:]
                         if arg.startswith("-") and f'"{arg.split("=", 1)[0]}' not in source]
    probed = probe_flags(sorted(probed_uses))
    for target, uses in probed_uses.items():
        result = probed[target]
        for where, cmd in uses:
            if "error" in result:
                problems.append(f"{where}\n    could not read its flags: {result['error']}")
                continue
            for arg in cmd[1:]:
                flag = arg.split("=", 1)[0]
                if arg.startswith("--") and flag not in result["flags"]:
                    problems.append(f"{where}\n    {target} has no flag {flag}")
    written = run_files()
    for where, cmd in cmds:
        problems += [f"{where}\n    no such preset: {arg}" for arg in cmd[1:]
                     if arg.startswith("config/") and not os.path.isfile(os.path.join(ROOT, arg))]
        for name in re.findall(r"(?:^|[=\s])out/[^/=,\s]+/([^/=,\s]+)", " ".join(cmd[1:])):  # out/<run>/<name>
            if not any(fnmatch.fnmatch(name, pattern) for pattern in written):
                problems.append(f"{where}\n    a trainer writes no {name} in its out_dir (only {', '.join(written)})")
    return problems


def run_files() -> list[str]:
    """The names the trainers write in an out_dir: their RUN_FILES, read from the source (no heavy import)."""
    found = []
    for script in ("train_sudoku.py", "train_fastdllm.py"):
        for node in ast.parse(open(os.path.join(ROOT, script), encoding="utf-8").read()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "RUN_FILES" for t in node.targets):
                found += ast.literal_eval(node.value)
    assert found, "the trainers' RUN_FILES moved: point run_files() at them"
    return sorted(set(found))


def test_docs_commands_name_existing_scripts_and_flags():
    """Fails when a command in README.md or docs/*.md names a missing script or preset, or a flag the script
    does not accept, or a checkpoint no trainer writes (checked by misspelling --relay_carry in README.md,
    pointing a command at a missing scripts/ file and a missing -m module, naming a missing config/ preset,
    and restoring the README's old out/fastdllm_relay/checkpoint-200)."""
    cmds = documented_commands()
    assert len(cmds) > 30, "the docs' commands were not found: has the parsing broken?"
    problems = command_problems(cmds)
    assert not problems, f"{len(problems)} documented command(s) would fail:\n" + "\n".join(problems)


def help_failures(targets: list[str]) -> dict[str, str]:
    """Run `python TARGET --help` for each target (a script path or `-m module`) from the repository root:
    {target: why} for each that does not exit 0 (a missing file exits 2). A few at a time: most import torch."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")

    def run(target: str) -> str | None:
        res = subprocess.run([sys.executable, *target.split(), "--help"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300, stdin=subprocess.DEVNULL)
        return None if res.returncode == 0 else \
            f"exit {res.returncode}: {(res.stderr.strip().splitlines() or ['(no output)'])[-1]}"

    with ThreadPoolExecutor(max_workers=min(4, (os.cpu_count() or 1) + 1)) as pool:
        return {t: why for t, why in zip(targets, pool.map(run, targets)) if why}


def help_targets(cmds: list[tuple[str, list[str]]]) -> dict[str, set[str]]:
    """{target: the files that name it} for every documented target that is missing or parses with a parser
    (a script that reads sys.argv by hand might run for real on --help)."""
    found = {}
    for where, cmd in cmds:
        path = target_path(cmd[0])
        if not os.path.isfile(path) or parses_with_a_parser(path):
            found.setdefault(cmd[0], set()).add(where.split(":", 1)[0])
    return found


def test_every_documented_script_answers_help():
    """Every script (or -m module) a command in README.md or docs/*.md runs answers `--help` with exit 0, run as
    a subprocess from the repository root. Fails when a documented script was moved or renamed and the docs
    kept the old path (checked: README.md's mini_check command pointed back at scripts/mini_check.py), or when
    a script cannot start (an import that moved with it)."""
    targets = help_targets(documented_commands())
    assert len(targets) > 15 and any(t.startswith("scripts/") for t in targets), "the docs' commands were not found"
    failed = help_failures(sorted(targets))
    assert not failed, f"{len(failed)} documented script(s) do not answer --help:\n" + "\n".join(
        f"python {t} --help ({', '.join(sorted(targets[t]))})\n    {why}" for t, why in sorted(failed.items()))


def shell_scripts(snippet: str) -> list[str]:
    """The `.sh` files a shell line runs with bash (`bash scripts/x.sh`, `VAR=1 bash x.sh`)."""
    return re.findall(r"(?:^|[\s;&|(])(?:bash|sh)\s+([\w./-]+\.sh)\b", snippet)


def test_documented_shell_scripts_exist():
    """Every `bash X.sh` in README.md and docs/*.md names a file (checked with scripts/gpu_wheels.sh, its old path)."""
    found = [(os.path.relpath(path, ROOT), script) for path in doc_files()
             for snippet in code_snippets(open(path, encoding="utf-8").read()) for script in shell_scripts(snippet)]
    assert found, "no `bash X.sh` found in the docs: has the parsing broken?"
    missing = [f"{where}: bash {script}" for where, script in found if not os.path.isfile(os.path.join(ROOT, script))]
    assert not missing, "documented shell scripts that do not exist:\n" + "\n".join(missing)


def test_command_parsing():
    snippet = "for o in mlm relay; do OMP_NUM_THREADS=1 python scripts/x.py --a=1 --b=$o & done; wait"
    assert commands(snippet) == [["scripts/x.py", "--a=1", "--b=$o"]]
    assert commands("torchrun --nproc_per_node=2 t.py config/c.py --k=v  # note") == [["t.py", "config/c.py", "--k=v"]]
    assert commands("python -m fastdllm.generate --x=1 && python -c 'print(1)'") == [["-m fastdllm.generate", "--x=1"]]
    assert code_snippets("a `python a.py\n--b=1` c\n```bash\npython x.py \\\n  --y=2\n```\n") == \
        ["python x.py    --y=2", "python a.py --b=1"]
    assert shell_scripts("PY_VERSION=3.11 bash scripts/gpu/w.sh && sh b.sh; echo bash") == ["scripts/gpu/w.sh", "b.sh"]


# -----------------------------------------------------------------------------
# the probe: run in a subprocess by probe_flags, never imported for its side effects


class Parsed(Exception):
    def __init__(self, flags: list[str]):
        self.flags = flags


def intercept_parsers() -> None:
    import argparse
    import dataclasses

    def argparse_hook(parser, *args, **kwargs):
        raise Parsed([o for action in parser._actions for o in action.option_strings])

    def config_hook(cls, argv=None):
        raise Parsed(["--" + f.name for f in dataclasses.fields(cls)] + ["--help", "-h"])

    argparse.ArgumentParser.parse_args = argparse_hook
    argparse.ArgumentParser.parse_known_args = argparse_hook
    sys.path.insert(0, ROOT)
    import configurator  # the trainers' typed config; an ImportError here means it moved: update this probe
    configurator.load_config = config_hook


def probe(target: str) -> dict:
    """Run one target as __main__ up to its argument parsing; report the flags its parser knows."""
    import runpy
    sys.argv = [target]
    sys.path[0] = ROOT if target.startswith("-m ") else os.path.dirname(os.path.join(ROOT, target))
    try:
        if target.startswith("-m "):
            runpy.run_module(target[3:], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.join(ROOT, target), run_name="__main__")
    except Parsed as p:
        return {"flags": p.flags}
    except BaseException as e:  # SystemExit included: the script stopped before parsing its arguments
        return {"error": f"{type(e).__name__}: {e}"}
    return {"error": "it finished without parsing arguments through argparse or configurator"}


if __name__ == "__main__":
    os.chdir(ROOT)
    intercept_parsers()
    import contextlib
    import io
    results = {}
    for t in list(sys.argv[1:]):
        with contextlib.redirect_stdout(io.StringIO()):
            results[t] = probe(t)
    print(json.dumps(results))
