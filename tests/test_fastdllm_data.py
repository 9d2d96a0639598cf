"""fastdllm/data.py: the c40m60 filters on rows written here, ChatML supervision, padding, CLI."""
import json

import pytest

from fastdllm.data import (build_mixture, collate, filter_code_row, filter_math_row, main, prompt_key, read_jsonl,
                           tokenize_conversation, to_messages)
from fastdllm.model import make_tiny_tokenizer

GOOD_CODE = {"input": "Write a function that doubles x.", "output": "def double(x):\n    return 2 * x",
             "unit_tests": "['assert double(2) == 4', 'assert double(0) == 0']", "average_test_score": "1.0",
             "tests_execution_status": "['pass', 'pass']"}
GOOD_MATH = {"problem": "What is 2 + 3?", "generated_solution": "2 + 3 = \\boxed{5}."}


def test_code_filters_each_reject():
    assert filter_code_row(GOOD_CODE) == (GOOD_CODE["input"], GOOD_CODE["output"])
    bad = {
        "empty prompt": {"input": "  "},
        "no def": {"output": "print(2 * x)"},
        "tests do not parse": {"unit_tests": "[assert double(2) == 4"},
        "no tests": {"unit_tests": "[]"},
        "score below 1": {"average_test_score": 0.9},
        "a failed test": {"tests_execution_status": ["pass", "fail"]},
        "leak": {"input": "Solve this HumanEval task: double x."},
        "leak in answer": {"output": "def double(x):  # from mbpp\n    return 2 * x"},
    }
    for why, change in bad.items():
        assert filter_code_row({**GOOD_CODE, **change}) is None, why
    assert filter_code_row({**GOOD_CODE, "output": "print(2 * x)"}, require_code_def=False) is not None
    assert filter_code_row({k: v for k, v in GOOD_CODE.items() if k != "tests_execution_status"}) is not None


def test_math_filters():
    assert filter_math_row(GOOD_MATH) == (GOOD_MATH["problem"], GOOD_MATH["generated_solution"])
    assert filter_math_row({"problem": "p", "solution": "s"}) == ("p", "s")  # fallback field
    assert filter_math_row({**GOOD_MATH, "problem": "x" * 4001}) is None
    assert filter_math_row({**GOOD_MATH, "generated_solution": "x" * 6001}) is None
    assert filter_math_row({**GOOD_MATH, "problem": "From MATH-500: what is 2 + 3?"}) is None


def test_dedup_key_normalises_case_and_whitespace():
    assert prompt_key("What  is\n2+3?") == prompt_key("what is 2+3?  ")
    assert prompt_key("what is 2+3?") != prompt_key("what is 2+4?")


def test_mixture_counts_shared_dedup_length_and_shortfall():
    tok = make_tiny_tokenizer()
    code = [{**GOOD_CODE, "input": f"Write function number {i}."} for i in range(5)]
    code.insert(1, dict(code[0]))  # exact duplicate
    code.insert(2, {**GOOD_CODE, "input": "Too long.", "output": "def f():\n" + "    x = 1\n" * 100})
    math = [{"problem": "write function number 0.", "generated_solution": "dup of a code prompt"}]  # shared dedup
    math += [{"problem": f"What is {i} + 1?", "generated_solution": f"{i + 1}"} for i in range(4)]
    rows, summary = build_mixture(iter(code), iter(math), tok, n_code=3, n_math=3, max_tokens=200, seed=0)
    assert summary["code_rows"] == 3 and summary["math_rows"] == 3
    assert summary["stats"]["code"]["duplicate"] == 1 and summary["stats"]["code"]["too_long"] == 1
    assert summary["stats"]["math"]["duplicate"] == 1
    assert sorted(r["source"] for r in rows) == ["code"] * 3 + ["math"] * 3
    for r in rows:
        assert r["tokenized_chat_len"] == len(tokenize_conversation(tok, r["messages"], 10 ** 6)[0]) <= 200
    again, _ = build_mixture(iter(code), iter(math), tok, n_code=3, n_math=3, max_tokens=200, seed=0)
    assert again == rows  # the shuffle is seeded
    with pytest.raises(ValueError, match="only 2 math rows"):
        build_mixture(iter(code), iter(math[:3]), tok, n_code=3, n_math=3, max_tokens=200)


def test_chatml_supervises_answer_and_im_end_only():
    tok = make_tiny_tokenizer()
    ids, sup = tokenize_conversation(tok, to_messages("Add 1 and 2.", "3"), 2048)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nAdd 1 and 2.")
    assert tok.decode([i for i, s in zip(ids, sup) if s]) == "3<|im_end|>\n"
    assert text.endswith("<|im_start|>assistant\n3<|im_end|>\n")
    # left truncation keeps the answer
    short, ssup = tokenize_conversation(tok, to_messages("Add 1 and 2.", "3"), 10)
    assert short == ids[-10:] and ssup == sup[-10:]


def test_collate_right_pads_to_block_multiple():
    tok = make_tiny_tokenizer()
    rows = [tokenize_conversation(tok, to_messages("hi", "a" * n), 2048) for n in (1, 9)]
    x0, maskable = collate(rows, tok.pad_token_id, 32)
    longest = max(len(r[0]) for r in rows)
    assert x0.shape == (2, -(-longest // 32) * 32)
    n0 = len(rows[0][0])
    assert (x0[0, n0:] == tok.pad_token_id).all() and not maskable[0, n0:].any()
    assert maskable.sum() == sum(sum(s) for _, s in rows)
    assert collate(rows, tok.pad_token_id, 32, length=200)[0].shape == (2, 224)


def test_read_jsonl_formats_and_errors(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n\n" +
                 json.dumps({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "v"}]}) + "\n")
    assert read_jsonl(str(p)) == [to_messages("p", "a"), to_messages("u", "v")]
    p.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(str(p))
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "u"}]}) + "\n")
    with pytest.raises(ValueError, match="assistant"):
        read_jsonl(str(p))
    p.write_text("\n")  # an empty data set: one line, not an empty training run
    with pytest.raises(ValueError, match="no conversations"):
        read_jsonl(str(p))


def test_cli_local_source_and_offline_hub(tmp_path):
    src = tmp_path / "mine.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [{"prompt": "What is 1 + 1?", "answer": "2"},
                                                    {"prompt": "what is 1 +  1?", "answer": "two"},  # duplicate prompt
                                                    {"prompt": "A humaneval task", "answer": "x"},  # leak
                                                    {"prompt": "Long?", "answer": "y" * 400}]) + "\n")  # > max_tokens
    out = tmp_path / "sft"
    main([f"--source={src}", "--tokenizer=tiny", f"--out_dir={out}", "--max_tokens=300"])
    rows = [json.loads(l) for l in open(out / "train.jsonl")]
    assert [r["messages"][-1]["content"] for r in rows] == ["2"]
    stats = json.load(open(out / "prep_summary.json"))["stats"]
    assert (stats["duplicate"], stats["leak"], stats["too_long"]) == (1, 1, 1)
    with pytest.raises(SystemExit, match="cannot stream nvidia/OpenCodeInstruct"):
        main(["--source=hub", "--tokenizer=tiny", f"--out_dir={tmp_path / 'hub'}"])
    with pytest.raises(SystemExit, match="cannot load the tokenizer"):
        main(["--source=toy", "--tokenizer=Efficient-Large-Model/Fast_dLLM_v2_1.5B", f"--out_dir={tmp_path / 't'}"])


@pytest.mark.parametrize("argv, flag", [
    (["--out_dir=FILE"], "--out_dir"),  # used to tokenise every row, then end in a FileExistsError traceback
    (["--out_dir=FILE/sub"], "--out_dir"),
    (["--toy_rows=-1"], "--toy_rows"),  # used to end in "no rows left after filtering", naming no flag
    (["--max_tokens=0"], "--max_tokens"),
    (["--code_rows=-5"], "--code_rows"),
    (["--source=hub", "--code_rows=0", "--math_rows=0"], "--math_rows"),
    (["--seed=abc"], "--seed"),
])
def test_cli_refuses_bad_flags_before_any_work(argv, flag, tmp_path, monkeypatch, capsys):
    """One line naming the flag, before the tokenizer loads, nothing written. Failed before the checks for
    every case but --seed=abc (checked: the tokenizer loaded)."""
    import fastdllm.data
    monkeypatch.setattr(fastdllm.data, "load_tokenizer", lambda name: pytest.fail(f"{argv}: work started"))
    afile = tmp_path / "afile"
    afile.write_text("keep")
    argv = ["--source=toy", "--tokenizer=tiny", f"--out_dir={tmp_path / 'out'}",
            *[a.replace("FILE", str(afile)) for a in argv]]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in last, last
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and afile.read_text() == "keep"
