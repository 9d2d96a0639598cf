"""The HumanEval(+) harness: prompt, post-processing, sandboxed execution and scoring.

The HumanEval+ tests need EvalPlus' HumanEvalPlus.jsonl.gz (release v0.1.10, docs/sandbox.md says where to
get it): `python -m pytest --humanevalplus=PATH` or RELAY_HUMANEVALPLUS=PATH; without it they are skipped
with that reason. Scoring tests run in the strongest sandbox this machine has, or, where none works, in the
unsafe mode: they judge the tests' own programs and the tiny model's noise, not an untrusted model's code.
"""
import gzip
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import eval_code
import fastdllm.judge
import fastdllm.sandbox
from eval_code import batches, load_problems, make_prompt, sanitize, to_solution, to_solution_authors
from fastdllm.judge import judge_solutions, plus_columns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scoring_mode() -> str:
    try:
        return fastdllm.sandbox.choose_mode("auto").mode
    except ValueError:
        return "unsafe"


MODE = _scoring_mode()
SANDBOX = f"--sandbox={MODE}"


@pytest.fixture(scope="session")
def plus_path(pytestconfig) -> str:
    """The HumanEvalPlus file given with --humanevalplus or RELAY_HUMANEVALPLUS; skips without one, fails
    on a path that is not a file (a typo must not look like a missing data set)."""
    path = pytestconfig.getoption("--humanevalplus")
    if not path:
        pytest.skip("needs HumanEvalPlus.jsonl.gz: pass --humanevalplus=PATH or set RELAY_HUMANEVALPLUS "
                    "(where to get it: docs/sandbox.md)")
    if not os.path.isfile(path):
        pytest.fail(f"--humanevalplus / RELAY_HUMANEVALPLUS: {path} is not a file")
    return path


@pytest.fixture(scope="module")
def plus_problems(plus_path):
    with gzip.open(plus_path, "rt") as f:
        return {p["task_id"]: p for p in map(json.loads, f)}


@pytest.fixture(scope="module")
def gt_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gt"))


def test_canonical_solutions_pass_all_humaneval_base():
    problems, has_plus = load_problems("humaneval")
    assert len(problems) == 164 and not has_plus
    results = judge_solutions(problems, [p["prompt"] + p["canonical_solution"] for p in problems], has_plus=False, mode=MODE)
    failed = [p["task_id"] for p, r in zip(problems, results) if not r["base"]]
    assert failed == []


def test_wrong_and_broken_solutions_fail_base():
    problems = load_problems("humaneval")[0][:3]
    wrong = [p["prompt"] + "    return None\n" for p in problems]
    broken = [p["prompt"] + "    return (\n" for p in problems]  # syntax error
    assert [r["base"] for r in judge_solutions(problems, wrong, has_plus=False, mode=MODE)] == [False] * 3
    assert [r["base"] for r in judge_solutions(problems, broken, has_plus=False, mode=MODE)] == [False] * 3


def test_infinite_loop_is_killed_by_the_time_limit():
    p = load_problems("humaneval")[0][0]
    t0 = time.perf_counter()
    r = judge_solutions([p], [p["prompt"] + "    while True:\n        pass\n"], has_plus=False, mode=MODE, timeout=2.0)[0]
    assert not r["base"] and "timed out" in r["error"]
    assert time.perf_counter() - t0 < 15


def test_memory_limit():
    p = load_problems("humaneval")[0][0]
    hog = p["prompt"] + "    x = bytearray(8 * 2**30)\n    return True\n"
    r = judge_solutions([p], [hog], has_plus=False, mode=MODE, memory_gb=1.0)[0]
    assert not r["base"] and "MemoryError" in r["error"]


def test_plus_canonical_pass_and_base_only_lookup_fails_plus(plus_problems, gt_cache):
    probs = [plus_problems[f"HumanEval/{i}"] for i in (0, 2, 32, 53)]  # 2: float atol, 32: find_zero oracle
    canon = [p["prompt"] + p["canonical_solution"] for p in probs]
    res = judge_solutions(probs, canon, has_plus=True, mode=MODE, cache_dir=gt_cache)
    assert [(r["base"], r["plus"]) for r in res] == [(True, True)] * 4
    # a solution that memorised the base tests: passes base, fails the extra plus inputs
    p = probs[3]  # add(x, y)
    table = {repr(tuple(inp)): inp[0] + inp[1] for inp in p["base_input"]}
    lookup = f"TABLE = {table!r}\n\ndef add(x, y):\n    return TABLE[repr((x, y))]\n"
    r = judge_solutions([p], [lookup], has_plus=True, mode=MODE, cache_dir=gt_cache)[0]
    assert r["base"] and r["plus"] is False
    # wrong, and an infinite loop under the per-input limit (EvalPlus: max(1 s, 4 x reference time))
    t0 = time.perf_counter()
    bad = judge_solutions([p, p], ["def add(x, y):\n    return x - y\n", "def add(x, y):\n    while True: pass\n"],
                has_plus=True, mode=MODE, cache_dir=gt_cache)
    assert [(r["base"], r["plus"]) for r in bad] == [(False, False)] * 2
    assert time.perf_counter() - t0 < 20


def test_each_input_has_its_own_time_limit():
    """A program fast on four inputs and 1.5 s slow on the third, each input limited to 0.5 s: the slow input
    fails by its own limit, although the whole job (its cap: the sum of the limits plus slack, 4 s) would
    let it finish. Bug checked: the per-input timer not armed (the job passed within its cap)."""
    code = "import time\n\ndef f(x):\n    if x == 2:\n        time.sleep(1.5)\n    return x\n"
    outputs, _, error = fastdllm.judge.run_outputs(code, "f", [[0], [1], [2], [3]], [0.5] * 4, mode=MODE)
    assert outputs is None and error == "Timeout on input 2"
    fast, times, error = fastdllm.judge.run_outputs(code, "f", [[0], [1], [3]], [0.5] * 3, mode=MODE)
    assert error == "" and len(fast) == 3 and max(times) < 0.5


def test_float_outputs_compared_within_atol(plus_problems, gt_cache):
    p = plus_problems["HumanEval/2"]  # truncate_number, atol 1e-6
    close = "def truncate_number(number: float) -> float:\n    return number - int(number) + 1e-9\n"
    far = "def truncate_number(number: float) -> float:\n    return number - int(number) + 1e-4\n"
    a, b = judge_solutions([p, p], [close, far], has_plus=True, mode=MODE, cache_dir=gt_cache)
    assert a["base"] and a["plus"] and not b["base"]


def test_sanitize_keeps_what_the_entry_point_needs():
    code = (
        "import math\nfrom typing import List\n\nCONST = 3\nUNUSED = 4\n\n"
        "def helper(x):\n    return x * CONST\n\n@staticmethod\ndef other():\n    pass\n\n"
        "def solve(xs: List[int]) -> int:\n    return sum(helper(x) for x in xs)\n\n"
        "print(solve([1, 2]))\nassert solve([1]) == 3\n\nif __name__ == '__main__':\n    solve([])\n"
        "def broken(:\n"  # generation cut mid-definition: dropped
    )
    out = sanitize(code, "solve")
    assert "import math" in out and "from typing import List" in out
    assert "CONST = 3" in out and "def helper" in out and "def solve" in out
    assert "UNUSED" not in out and "def other" not in out and "print(" not in out
    assert "assert" not in out and "__main__" not in out and "broken" not in out
    ns = {}
    exec(out, ns)
    assert ns["solve"]([1, 2]) == 9
    assert sanitize(code, "missing") == ""
    assert "def other" in sanitize(code, None) and "@staticmethod" in sanitize(code, None)


def test_to_solution_cuts_at_the_fence_and_completes_a_bare_body():
    p = load_problems("humaneval")[0][0]
    full = "def has_close_elements(numbers, threshold):\n    return False\n```\n\nExplanation: ...```python\nx = 1\n"
    sol = to_solution(full, p)
    assert sol.strip() == "def has_close_elements(numbers, threshold):\n    return False"
    body = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```"
    sol = to_solution(body, p)
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in sol
    assert judge_solutions([p], [sol], has_plus=False, mode=MODE)[0]["base"]


def test_prompt_is_the_evalplus_instruct_prompt():
    from fastdllm.model import make_tiny_tokenizer
    task = "def f(x):\n    \"\"\"Return x.\"\"\"\n"
    prompt = make_prompt(task, make_tiny_tokenizer())
    assert prompt.startswith("<|im_start|>system\n")
    assert f"<|im_start|>user\n{eval_code.INSTRUCTION}\n```\n{task.strip()}\n```\n<|im_end|>" in prompt
    assert prompt.endswith(f"<|im_start|>assistant\n{eval_code.RESPONSE}\n```python\n")


def test_missing_data_gives_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match="MbppPlus"):
        eval_code.main(["--dataset=mbpp", f"--out_dir={tmp_path}", "--canonical=True"])
    with pytest.raises(SystemExit, match="does not exist"):
        eval_code.main([f"--data_path={tmp_path}/nope.jsonl", f"--out_dir={tmp_path}", "--canonical=True"])
    with pytest.raises(SystemExit, match="unknown dataset"):
        eval_code.main(["--dataset=gsm8k", f"--out_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="unknown config key"):
        eval_code.main(["--bogus=1"])


def test_command_end_to_end_with_the_tiny_model(tmp_path):
    summary = eval_code.main(["--model=tiny", "--limit=2", "--max_new_tokens=32", "--batch_size=2", SANDBOX,
                              f"--out_dir={tmp_path}", "--device=cpu"])
    rows = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    assert all(r["prompt"].endswith("```python\n") and r["nfe"] >= 1 for r in rows)
    assert summary["mean_nfe"] == sum(r["nfe"] for r in rows) / 2 and summary["tokens_per_s"] > 0
    judged = {r["task_id"]: r for r in map(json.loads, open(tmp_path / "judged.jsonl"))}
    assert summary["pass1_base"] == 100.0 * sum(judged[r["task_id"]]["base"] for r in rows) / 2
    assert json.load(open(tmp_path / "results.json"))["n_problems"] == 2


def test_command_canonical_with_plus_file(tmp_path, plus_path):
    summary = eval_code.main(["--canonical=True", f"--data_path={plus_path}", "--limit=5", f"--out_dir={tmp_path}", SANDBOX,
                              f"--gt_cache_dir={tmp_path}/gt"])
    assert summary["pass1_base"] == 100.0
    assert summary["pass1_plus_evalplus"] == summary["pass1_plus_authors"] == 100.0


@pytest.mark.slow
def test_all_canonical_solutions_pass_humaneval_plus(plus_problems, gt_cache):
    problems = list(plus_problems.values())
    results = judge_solutions(problems, [p["prompt"] + p["canonical_solution"] for p in problems], has_plus=True, mode=MODE,
                    cache_dir=gt_cache)
    assert [p["task_id"] for p, r in zip(problems, results) if not (r["base"] and r["plus"])] == []


def test_plus_alone_is_scored_when_base_fails(plus_problems, gt_cache):
    """A solution wrong on one base input only: EvalPlus' rule gives plus False, the authors' rule (plus
    tests alone) True. Checked to fail when the plus tests run only after base passed."""
    p = plus_problems["HumanEval/53"]  # add(x, y)
    bad = next(tuple(i) for i in p["base_input"] if i not in p["plus_input"])
    sol = f"def add(x, y):\n    return -1 if (x, y) == {bad!r} else x + y\n"
    r = judge_solutions([p], [sol], has_plus=True, mode=MODE, cache_dir=gt_cache)[0]
    assert (r["base"], r["plus"], r["plus_inputs"]) == (False, False, True)
    assert plus_columns([r, {"base": True, "plus_inputs": True}]) == dict(pass1_plus_evalplus=50.0, pass1_plus_authors=100.0)


def test_authors_post_processing_strips_the_whole_completion():
    """The authors strip() the raw completion: a bare body loses its first line's indentation, so the stub +
    body no longer parses as one function and only the stub's def (docstring, no body) survives; ours
    keeps the indentation and completes the stub. Checked to fail with lstrip() of newlines only."""
    p = load_problems("humaneval")[0][0]
    body = "    return False\n```\nmore"
    assert "return False" not in to_solution_authors(body, p)
    assert "def has_close_elements" in to_solution_authors(body, p)
    assert "    return False" in to_solution(body, p)
    full = "\n\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    assert to_solution_authors(full, p).strip() == "def has_close_elements(numbers, threshold):\n    return False"


def test_authors_batches_by_character_length_shortest_first():
    """The authors' harness sorts prompts by length in characters (not tokens), ascending and stable, then
    cuts batches. Checked to fail with a token-length key or a descending sort."""
    prompts = ["ccc", "a", "bb", "dd", "e" * 10]
    ids = [[0] * 9, [0] * 5, [0] * 1, [0] * 2, [0] * 3]  # token lengths order differently
    assert batches(prompts, ids, 2, "authors") == [[1, 2], [3, 0], [4]]
    assert batches(prompts, ids, 2, "batch_invariant") == [[2, 3], [4, 1], [0]]


@pytest.mark.parametrize("arg,message", [("--threshold=1.5", "threshold must be in (0, 1]"),
                                         ("--threshold=nan", "threshold"), ("--decode=fast", "decode must be one of"),
                                         ("--max_new_tokens=16", "must be >= block_size"),
                                         ("--sub_block_size=5", "positive multiple of sub_block_size"),
                                         ("--top_p=0", "0 < top_p <= 1"), ("--dtype=float16", "--dtype must be"),
                                         ("--device=gpu", "--device must be"), ("--timeout=-1", "--timeout must be")])
def test_decoding_settings_are_checked_before_the_model_loads(tmp_path, monkeypatch, arg, message):
    """They used to reach the user only after the model (minutes for the 1.5B) was loaded."""
    monkeypatch.setattr(eval_code, "_load_model", lambda cfg: pytest.fail("the model was loaded before the check"))
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        eval_code.main(["--model=some/model", "--limit=1", SANDBOX, arg, f"--out_dir={tmp_path / 'o'}"])
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()


def test_bad_generation_settings_give_one_line(tmp_path):
    """Settings generate() refuses reach the user as one line (SystemExit), not a traceback. Checked to
    fail without the ValueError -> SystemExit wrapper around generate in main."""
    base = ["--model=tiny", "--limit=1", "--device=cpu", SANDBOX]
    for k, (arg, msg) in enumerate((("--threshold=1.5", "threshold"), ("--max_new_tokens=5000", "context"),
                                    ("--max_new_tokens=16", "block_size"), ("--decode=fast", "decode"))):
        with pytest.raises(SystemExit, match=msg):
            eval_code.main(base + [arg, f"--out_dir={tmp_path / str(k)}"])


# -----------------------------------------------------------------------------
# evaluation that cannot be lost: append-only logs, resume, --samples, input checks

TINY = ["--model=tiny", "--limit=6", "--max_new_tokens=32", "--batch_size=2", "--device=cpu", "--workers=2", SANDBOX]


class Killed(BaseException):
    """Stands for a kill during generation (BaseException: nothing in eval_code may catch it)."""


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_killed_generation_resumes_with_the_recorded_batch_plan(tmp_path, monkeypatch):
    """Killed after 2 of 3 batches, re-run with a DIFFERENT batching function: the resumed run decodes
    only the missing batch, with the task_ids plan.json recorded, and ends with the same completions
    as an uninterrupted run. Checked: fails if generate_all recomputes the plan on resume (batch 2
    gets other tasks), if done batches are decoded again (4 calls instead of 1), or if a torn last
    line stops the resume."""
    import fastdllm.generate
    full, cut = tmp_path / "full", tmp_path / "cut"
    eval_code.main(TINY + [f"--out_dir={full}"])
    real, calls = fastdllm.generate.generate, []

    def dies_at_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Killed()
        return real(*args, **kwargs)
    monkeypatch.setattr(fastdllm.generate, "generate", dies_at_third_batch)
    with pytest.raises(Killed):
        eval_code.main(TINY + [f"--out_dir={cut}"])
    assert len(_rows(cut / "samples.jsonl")) == 4 and not (cut / "judged.jsonl").exists()
    with open(cut / "samples.jsonl", "a") as f:
        f.write('{"task_id": "HumanEval/9", "compl')  # a SIGKILL in the middle of a write
    calls.clear()
    monkeypatch.setattr(fastdllm.generate, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(eval_code, "batches", lambda prompts, ids, bs, decode: [[i] for i in reversed(range(len(ids)))])
    summary = eval_code.main(TINY + [f"--out_dir={cut}"])
    assert len(calls) == 1
    plan = json.load(open(cut / "plan.json"))["batches"]
    assert plan == json.load(open(full / "plan.json"))["batches"] and [len(b) for b in plan] == [2, 2, 2]
    keep = ("task_id", "completion", "solution", "nfe", "batch")
    a = sorted(tuple(r[k] for k in keep) for r in _rows(full / "samples.jsonl"))
    b = sorted(tuple(r[k] for k in keep) for r in _rows(cut / "samples.jsonl"))
    assert a == b and len(b) == 6
    assert summary["n_problems"] == 6 and len(_rows(cut / "judged.jsonl")) == 6


SLOW = "\nimport time\ntime.sleep(0.4)\n"  # top level, after the function


def test_sigkill_while_judging_loses_no_verdict(tmp_path):
    """eval_code.py --samples killed with SIGKILL while judging, then re-run: every task is judged
    exactly once overall and the verdicts are right (canonical passes, `return None` fails).
    Checked: fails if the verdicts are not appended as they are judged (no judged.jsonl at the kill)."""
    problems = load_problems("humaneval")[0][:8]
    samples = tmp_path / "in.jsonl"
    with open(samples, "w") as f:
        for i, p in enumerate(problems):  # EvalPlus fields: completion is appended to the prompt
            body = p["canonical_solution"] if i % 2 == 0 else "    return None\n"
            f.write(json.dumps({"task_id": p["task_id"], "completion": body + SLOW}) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "eval_code.py", f"--samples={samples}", "--limit=8", f"--out_dir={out}", "--workers=1", SANDBOX]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the killed run leaves its job directory behind
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "judged.jsonl").exists() and len(open(out / "judged.jsonl").read().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    first = len(_rows(out / "judged.jsonl"))
    assert 2 <= first < 8
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
    rows = _rows(out / "judged.jsonl")
    assert sorted(r["task_id"] for r in rows) == sorted(p["task_id"] for p in problems)
    assert [r["base"] for r in sorted(rows, key=lambda r: int(r["task_id"].split("/")[1]))] == [True, False] * 4
    assert json.load(open(out / "results.json"))["pass1_base"] == 50.0


def test_samples_file_is_scored_without_a_model(tmp_path, monkeypatch, capsys):
    """--samples: `solution` is the whole program, `completion` goes after the prompt (EvalPlus); the
    isolation mode is printed and recorded. Checked: fails if `completion` is judged without the prompt,
    if a model is loaded, or if main() stops printing the sandbox mode."""
    monkeypatch.setattr(eval_code, "_load_model", lambda cfg: pytest.fail("--samples loaded a model"))
    problems = load_problems("humaneval")[0][:3]
    rows = [{"task_id": problems[0]["task_id"], "completion": problems[0]["canonical_solution"]},
            {"task_id": problems[1]["task_id"], "solution": problems[1]["prompt"] + problems[1]["canonical_solution"]},
            {"task_id": problems[2]["task_id"], "solution": "def truncate_number(number):\n    return 0.0\n"}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = eval_code.main([f"--samples={tmp_path}/s.jsonl", "--limit=3", f"--out_dir={tmp_path}/out", SANDBOX])
    judged = {r["task_id"]: r["base"] for r in _rows(tmp_path / "out" / "judged.jsonl")}
    assert judged == {"HumanEval/0": True, "HumanEval/1": True, "HumanEval/2": False}
    assert summary["mean_nfe"] is None and abs(summary["pass1_base"] - 200 / 3) < 1e-9
    assert f"sandbox: {MODE}" in capsys.readouterr().out and summary["sandbox"] == MODE


def _bad_inputs(tmp_path, plus: str):
    """(arguments, what the one-line error must say) for the bad-input sweep."""
    d = tmp_path
    (d / "empty.jsonl").write_text("")
    (d / "notjson.jsonl").write_text('{"task_id": 1}\nnot json\n')
    (d / "notgzip.jsonl.gz").write_text('{"task_id": "x"}\n')
    (d / "a_file").write_text("x")
    (d / "bad.py").write_text("limit = (\n")
    row = {k: [] for k in eval_code.EVALPLUS_KEYS}
    (d / "lacks.jsonl").write_text(json.dumps(dict(row, task_id="a", prompt="", entry_point="f", canonical_solution="")) + "\n"
                                   + json.dumps({"task_id": "b"}) + "\n")
    data = open(plus, "rb").read() if plus else gzip.compress(b'{"task_id": "x"}\n' * 5000)
    (d / "truncated.jsonl.gz").write_bytes(data[:len(data) // 2])
    (d / "dup.jsonl").write_text('{"task_id": "HumanEval/0", "solution": "x"}\n' * 2)
    (d / "unknown.jsonl").write_text('{"task_id": "HumanEval/999", "solution": "x"}\n')
    (d / "nofield.jsonl").write_text('{"task_id": "HumanEval/0", "code": "x"}\n')
    (d / "other_run").mkdir()
    config = {k: v for k, v in vars(eval_code.EvalConfig(canonical=True, limit=7)).items()
              if k not in eval_code.RESUMABLE_KEYS}
    (d / "other_run" / "plan.json").write_text(json.dumps({"config": config, "batches": []}))
    (d / "empty_model").mkdir()
    (d / "old_run").mkdir()
    (d / "old_run" / "samples.jsonl").write_text("{}\n")
    return [
        (["--workers=-1"], "--workers must be >= 0"), (["--timeout=0"], "--timeout must be finite and > 0"),
        (["--memory_gb=-1"], "--memory_gb"), (["--limit=-3"], "--limit"), (["--batch_size=0"], "--batch_size"),
        (["--sandbox=docker"], "sandbox must be one of"), (["--dataset=gsm8k"], "unknown dataset"),
        (["--bogus=1"], "unknown config key"), ([str(d / "bad.py")], "config error"),
        ([f"--data_path={d}/missing.jsonl"], "does not exist"), ([f"--data_path={d}"], "is a directory"),
        ([f"--data_path={d}/empty.jsonl"], "holds no rows"), ([f"--data_path={d}/notjson.jsonl"], "line 2: not JSON"),
        ([f"--data_path={d}/notgzip.jsonl.gz"], "not gzip"), ([f"--data_path={d}/truncated.jsonl.gz"], "truncated"),
        ([f"--data_path={d}/lacks.jsonl"], "row 2 lacks"),
        ([f"--samples={d}/missing.jsonl"], "does not exist"), ([f"--samples={d}/dup.jsonl"], "a second sample"),
        ([f"--samples={d}/unknown.jsonl"], "not in the problem set"), ([f"--samples={d}/nofield.jsonl"], "needs a string"),
        ([f"--samples={d}/empty.jsonl"], "holds no rows"), (["--canonical=True", f"--samples={d}/dup.jsonl"], "pass one"),
        (["--canonical=True", f"--out_dir={d}/a_file"], "is a file"),
        (["--canonical=True", f"--out_dir={d}/a_file/sub"], "is a file"),
        (["--canonical=True", f"--out_dir={d}/other_run"], "holds a run with limit=7"),
        (["--canonical=True", f"--out_dir={d}/old_run"], "without plan.json"),
        ([f"--model={d}/empty_model", "--limit=1"], "config.json"),
        (["--cuda_graph=True", "--device=cpu"], "needs a CUDA device"),
        (["--cuda_graph=True", "--sub_block_cache=True"], "needs prefix_cache=True and sub_block_cache=False"),
    ] + ([(["--canonical=True", f"--data_path={plus}", f"--gt_cache_dir={d}/a_file"], "is a file")] if plus else [])


def test_bad_inputs_fail_in_one_line_before_any_work(tmp_path, pytestconfig, capsys):
    """Every bad input: exit code != 0, one line on stderr naming the problem, no traceback, nothing
    written. The sweep calls main() in this process (a SystemExit carrying one line is what the command
    prints; any other exception is the traceback a user would see); two cases also run as the command, so
    the entry point itself is covered. Checked: the eval_code.py before this change gave a traceback for
    --workers=-1 (after scoring), a truncated .gz, an empty file and a directory as --data_path; a
    ValueError raised for --workers=-1 fails both the in-process and the command check."""
    plus = pytestconfig.getoption("--humanevalplus")
    cases = _bad_inputs(tmp_path, plus if os.path.isfile(plus) else "")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}

    def with_defaults(args):
        out = [] if any(a.startswith("--out_dir") for a in args) else [f"--out_dir={tmp_path}/fresh"]
        return [*args, *out] + ([] if any(a.startswith("--sandbox") for a in args) else [SANDBOX])

    def command(args):
        return subprocess.run([sys.executable, "eval_code.py", *with_defaults(args)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    as_commands = [case for case in cases if case[0] in (["--workers=-1"], [f"--data_path={tmp_path}/empty.jsonl"])]
    with ThreadPoolExecutor(2) as pool:
        for (args, expected), p in zip(as_commands, pool.map(command, [args for args, _ in as_commands])):
            lines = [line for line in p.stderr.splitlines() if line.strip()]
            assert p.returncode != 0 and "Traceback" not in p.stderr, (args, p.stderr[-2000:])
            assert len(lines) == 1 and expected in lines[0], (args, lines)
    for args, expected in cases:
        with pytest.raises(SystemExit) as stop:
            eval_code.main(with_defaults(args))
        printed = capsys.readouterr().err + (stop.value.code if isinstance(stop.value.code, str) else "")
        lines = [line for line in printed.splitlines() if line.strip()]
        assert stop.value.code not in (0, None) and len(lines) == 1 and expected in lines[0], (args, lines)
    assert not (tmp_path / "fresh").exists()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


# -----------------------------------------------------------------------------
# the pass@1 columns, and the sandbox line the command prints

# base, plus inputs: base 3/5 = 60, EvalPlus plus (base and plus inputs) 1/5 = 20, authors' plus (plus
# inputs alone) 2/5 = 40: the three columns differ, so no one of them can stand in for another
VERDICTS = [(True, True), (True, False), (True, False), (False, True), (False, False)]
COLUMNS = dict(pass1_base=60.0, pass1_plus_evalplus=20.0, pass1_plus_authors=40.0)


def test_pass_at_1_columns_on_hand_made_verdicts(tmp_path, monkeypatch):
    """Every pass@1 column of results.json, pinned on verdicts where base, EvalPlus' plus and the
    authors' plus all differ: through pass_at_1 and through main() (a fake EvalPlus file, judge_solutions()
    replaced by the hand-made verdicts). Checked: fails if pass1_plus_evalplus counts base passes
    (60 != 20) or plus inputs alone (40 != 20), if pass1_plus_authors requires base too (20 != 40), and
    if main computes pass1_base from plus_inputs (40 != 60)."""
    rows = [{"base": b, "plus_inputs": p, "plus": b and p} for b, p in VERDICTS]
    assert fastdllm.judge.pass_at_1(rows, has_plus=True) == COLUMNS
    assert fastdllm.judge.pass_at_1(rows, has_plus=False) == dict(pass1_base=60.0, pass1_plus_evalplus=None, pass1_plus_authors=None)
    data = tmp_path / "plus.jsonl"
    data.write_text("".join(json.dumps(dict(task_id=f"T/{i}", prompt="", entry_point="f", canonical_solution="",
                                            base_input=[], plus_input=[])) + "\n" for i in range(5)))

    def fake_score(problems, solutions, has_plus, on_result=None, **kwargs):
        for i, row in enumerate(rows[:len(problems)]):
            on_result(i, dict(row, error=""))
    monkeypatch.setattr(fastdllm.judge, "judge_solutions", fake_score)
    summary = eval_code.main(["--canonical=True", f"--data_path={data}", f"--out_dir={tmp_path}/out", SANDBOX])
    assert {k: summary[k] for k in COLUMNS} == COLUMNS
    assert {k: v for k, v in json.load(open(tmp_path / "out" / "results.json")).items() if k in COLUMNS} == COLUMNS


def test_the_command_says_why_a_stronger_sandbox_is_not_used(tmp_path, monkeypatch, capsys):
    """main() prints the mode and, one line each, why every stronger mode was not used; with no isolating
    mode it stops with one line before anything is written, unless --sandbox=unsafe is given (then it
    runs and says so). Checked: fails if main prints only describe_mode (the old output), and if
    check_inputs lets auto continue in the unsafe mode."""
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "solution": "x = 1\n"}) + "\n")
    args = [f"--samples={samples}", "--limit=1"]
    monkeypatch.setattr(fastdllm.judge, "judge_task", lambda *a, **k: {"base": False, "plus": None, "plus_inputs": None, "error": "x"})
    monkeypatch.setattr(fastdllm.sandbox, "mode_problem", lambda m: "" if m == "namespaces" else f"{m} broken for this test")
    eval_code.main(args + [f"--out_dir={tmp_path}/a"])
    out = capsys.readouterr().out.splitlines()
    assert f"sandbox: {fastdllm.sandbox.describe_mode('namespaces')}" in out and "sandbox: bwrap not used: bwrap broken for this test" in out
    monkeypatch.setattr(fastdllm.sandbox, "mode_problem", lambda m: f"{m} broken for this test")
    with pytest.raises(SystemExit) as e:
        eval_code.main(args + [f"--out_dir={tmp_path}/b"])
    assert "\n" not in str(e.value) and "--sandbox=unsafe" in str(e.value) and "namespaces broken" in str(e.value)
    assert not (tmp_path / "b").exists()
    summary = eval_code.main(args + [f"--out_dir={tmp_path}/c", "--sandbox=unsafe"])
    assert summary["sandbox"] == "unsafe" and f"sandbox: {fastdllm.sandbox.describe_mode('unsafe')}" in capsys.readouterr().out


def test_two_evaluations_writing_one_ground_truth_cache_at_once_both_finish(tmp_path, monkeypatch):
    """Two evaluations sharing a cache (a study's two lanes) compute one task's ground truth; the second writes
    and renames the cache while the first is still writing. Both return the expected outputs and the cache is
    whole. Bug checked: one temporary name (cache.tmp) for every writer: the second truncated the first's file and
    renamed it away, and the first's rename failed (FileNotFoundError)."""
    problems = [dict(task_id="T/0", prompt="def f(x):\n", canonical_solution="    return x + 1\n", entry_point="f",
                     base_input=[[1]], plus_input=[[2]])]
    dump, nested = json.dump, []

    def dump_while_another_writes(obj, f, **kw):
        if not nested and isinstance(obj, dict) and "T/0" in obj:  # the first writer, writing the cache: a
            # second evaluation writes the same cache to the end
            nested.append(None)
            nested[0] = fastdllm.judge.ground_truth(problems, False, 1, 1.0, str(tmp_path), MODE)
        dump(obj, f, **kw)

    monkeypatch.setattr(fastdllm.judge.json, "dump", dump_while_another_writes)
    first = fastdllm.judge.ground_truth(problems, False, 1, 1.0, str(tmp_path), MODE)
    assert first["T/0"]["base_input"][0] == [2] and first["T/0"]["plus_input"][0] == [3] and nested[0] == first
    monkeypatch.setattr(fastdllm.judge.json, "dump", dump)
    [cache] = os.listdir(tmp_path)  # no temporary file left beside it
    assert json.load(open(tmp_path / cache)).keys() == {"T/0"}
