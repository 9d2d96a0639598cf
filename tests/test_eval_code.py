"""The HumanEval(+) harness: prompt, post-processing, sandboxed execution and scoring."""
import gzip
import json
import os
import time

import pytest

import eval_code
from eval_code import load_problems, make_prompt, sanitize, score, to_solution

PLUS = "/work/shared/data/HumanEvalPlus.jsonl.gz"
needs_plus = pytest.mark.skipif(not os.path.exists(PLUS), reason="HumanEvalPlus.jsonl.gz not available")


@pytest.fixture(scope="module")
def plus_problems():
    with gzip.open(PLUS, "rt") as f:
        return {p["task_id"]: p for p in map(json.loads, f)}


@pytest.fixture(scope="module")
def gt_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gt"))


def test_canonical_solutions_pass_all_humaneval_base():
    problems, has_plus = load_problems("humaneval")
    assert len(problems) == 164 and not has_plus
    results = score(problems, [p["prompt"] + p["canonical_solution"] for p in problems], has_plus=False)
    failed = [p["task_id"] for p, r in zip(problems, results) if not r["base"]]
    assert failed == []


def test_wrong_and_broken_solutions_fail_base():
    problems = load_problems("humaneval")[0][:3]
    wrong = [p["prompt"] + "    return None\n" for p in problems]
    broken = [p["prompt"] + "    return (\n" for p in problems]  # syntax error
    assert [r["base"] for r in score(problems, wrong, has_plus=False)] == [False] * 3
    assert [r["base"] for r in score(problems, broken, has_plus=False)] == [False] * 3


def test_infinite_loop_is_killed_by_the_time_limit():
    p = load_problems("humaneval")[0][0]
    t0 = time.perf_counter()
    r = score([p], [p["prompt"] + "    while True:\n        pass\n"], has_plus=False, timeout=2.0)[0]
    assert not r["base"] and "timed out" in r["error"]
    assert time.perf_counter() - t0 < 15


def test_memory_limit():
    p = load_problems("humaneval")[0][0]
    hog = p["prompt"] + "    x = bytearray(8 * 2**30)\n    return True\n"
    r = score([p], [hog], has_plus=False, memory_gb=1.0)[0]
    assert not r["base"] and "MemoryError" in r["error"]


@needs_plus
def test_plus_canonical_pass_and_base_only_lookup_fails_plus(plus_problems, gt_cache):
    probs = [plus_problems[f"HumanEval/{i}"] for i in (0, 2, 32, 53)]  # 2: float atol, 32: find_zero oracle
    canon = [p["prompt"] + p["canonical_solution"] for p in probs]
    res = score(probs, canon, has_plus=True, cache_dir=gt_cache)
    assert [(r["base"], r["plus"]) for r in res] == [(True, True)] * 4
    # a solution that memorised the base tests: passes base, fails the extra plus inputs
    p = probs[3]  # add(x, y)
    table = {repr(tuple(inp)): inp[0] + inp[1] for inp in p["base_input"]}
    lookup = f"TABLE = {table!r}\n\ndef add(x, y):\n    return TABLE[repr((x, y))]\n"
    r = score([p], [lookup], has_plus=True, cache_dir=gt_cache)[0]
    assert r["base"] and r["plus"] is False
    # wrong, and an infinite loop under the per-input limit (EvalPlus: max(1 s, 4 x reference time))
    t0 = time.perf_counter()
    bad = score([p, p], ["def add(x, y):\n    return x - y\n", "def add(x, y):\n    while True: pass\n"],
                has_plus=True, cache_dir=gt_cache)
    assert [(r["base"], r["plus"]) for r in bad] == [(False, False)] * 2
    assert time.perf_counter() - t0 < 20


@needs_plus
def test_float_outputs_compared_within_atol(plus_problems, gt_cache):
    p = plus_problems["HumanEval/2"]  # truncate_number, atol 1e-6
    close = "def truncate_number(number: float) -> float:\n    return number - int(number) + 1e-9\n"
    far = "def truncate_number(number: float) -> float:\n    return number - int(number) + 1e-4\n"
    a, b = score([p, p], [close, far], has_plus=True, cache_dir=gt_cache)
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
    assert score([p], [sol], has_plus=False)[0]["base"]


def test_prompt_is_the_evalplus_instruct_prompt():
    from fastdllm_model import make_tiny_tokenizer
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
    summary = eval_code.main(["--model=tiny", "--limit=2", "--max_new_tokens=16", "--batch_size=2",
                              f"--out_dir={tmp_path}", "--device=cpu"])
    rows = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    assert all(r["prompt"].endswith("```python\n") and r["nfe"] >= 1 for r in rows)
    assert summary["mean_nfe"] == sum(r["nfe"] for r in rows) / 2 and summary["tokens_per_s"] > 0
    judged = {r["task_id"]: r for r in map(json.loads, open(tmp_path / "judged.jsonl"))}
    assert summary["pass1_base"] == 100.0 * sum(judged[r["task_id"]]["base"] for r in rows) / 2
    assert json.load(open(tmp_path / "results.json"))["n_problems"] == 2


@needs_plus
def test_command_canonical_with_plus_file(tmp_path):
    summary = eval_code.main(["--canonical=True", f"--data_path={PLUS}", "--limit=5", f"--out_dir={tmp_path}",
                              f"--gt_cache_dir={tmp_path}/gt"])
    assert summary["pass1_base"] == 100.0 and summary["pass1_plus"] == 100.0


@pytest.mark.slow
@needs_plus
def test_all_canonical_solutions_pass_humaneval_plus(plus_problems, gt_cache):
    problems = list(plus_problems.values())
    results = score(problems, [p["prompt"] + p["canonical_solution"] for p in problems], has_plus=True,
                    cache_dir=gt_cache)
    assert [p["task_id"] for p, r in zip(problems, results) if not (r["base"] and r["plus"])] == []
