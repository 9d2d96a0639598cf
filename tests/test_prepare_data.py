"""prepare_data.py: generated splits, every input format, every bad-input class, the hub path offline,
Tim Vink derivation and the deduction-only cohort."""
import json
import os
import sys
import types

import numpy as np
import pandas as pd
import pytest

import prepare_data as P
import sudoku

NORVIG_HARD = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"
SIZES = ["--n_train=40", "--n_val=8", "--n_test=12"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sudoku"))
    P.main(["--out_dir=" + out, "--seed=3", "--workers=1", *SIZES])
    return out


@pytest.fixture(scope="module")
def puzzles(data_dir):
    """A small frame of generated puzzles (question, answer) to write in each format."""
    return pd.read_parquet(os.path.join(data_dir, "train.parquet"))


def digits(strings):
    return P.strings_to_digits(strings)


def test_generated_splits_are_unique_valid_and_disjoint(data_dir):
    splits = {s: P.load_puzzles(s, data_dir) for s in P.SPLITS}
    assert [len(splits[s]) for s in P.SPLITS] == [40, 8, 12]
    questions = [q for s in P.SPLITS for q in splits[s].frame["question"]]
    assert len(set(questions)) == len(questions)
    for split in splits.values():
        assert list(split.frame.columns[:4]) == ["source", "question", "answer", "rating"]
        assert split.question.dtype == np.int64 and split.question.shape == (len(split), 81)
        q, a = sudoku.tokens_to_digits(split.question), sudoku.tokens_to_digits(split.answer)
        assert ((split.question == sudoku.MASK) == (q == 0)).all()  # blanks are [MASK], never the '0' token
        assert (a > 0).all() and (sudoku.count_violations_batch(a) == 0).all()
        assert ((q == 0) | (q == a)).all()
        for row, rating in zip(q, split.frame["rating"]):
            assert sudoku.count_solutions(row) == 1 and sudoku.rate(row) == rating
    clues = (sudoku.tokens_to_digits(splits["train"].question) > 0).sum(axis=1)
    assert clues.max() <= 45 and clues.min() >= 17


def test_generation_is_deterministic_for_any_worker_count():
    sizes = {"train": 40, "val": 0, "test": 4}
    one, _ = P.generate_splits(7, sizes, 17, 45, workers=1)
    two, _ = P.generate_splits(7, sizes, 17, 45, workers=2)  # 40 jobs > 2 chunks: really uses the pool
    other, _ = P.generate_splits(8, sizes, 17, 45, workers=1)
    assert all(one[s].equals(two[s]) for s in P.SPLITS)
    assert not one["train"].equals(other["train"])
    # the test split only depends on the seed, not on how much training data is asked for
    smaller, _ = P.generate_splits(7, {"train": 5, "val": 0, "test": 4}, 17, 45, workers=1)
    assert smaller["test"].equals(one["test"])


def test_rerun_reuses_cache_and_stale_token_cache_is_rebuilt(data_dir, capsys):
    P.main(["--out_dir=" + data_dir, "--seed=3", "--workers=1", *SIZES])
    assert "reusing the data" in capsys.readouterr().out
    fresh = P.load_puzzles("val", data_dir)
    # the token cache is tied to the parquet file's size and mtime: touching the file invalidates it
    path = os.path.join(data_dir, "val.parquet")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    again = P.load_puzzles("val", data_dir)
    assert np.array_equal(again.question, fresh.question) and np.array_equal(again.answer, fresh.answer)
    with np.load(os.path.join(data_dir, "val.npz")) as z:
        assert np.array_equal(z["stamp"], P._parquet_stamp(path))


def test_data_from_another_generator_version_is_rebuilt(tmp_path, monkeypatch, capsys):
    """Fails if the cache key ignores sudoku.GENERATOR_VERSION (old, biased puzzles would be reused silently)."""
    out = str(tmp_path / "d")
    args = ["--out_dir=" + out, "--seed=3", "--workers=1", "--n_train=4", "--n_val=0", "--n_test=2"]
    P.main(args)
    capsys.readouterr()
    monkeypatch.setattr(sudoku, "GENERATOR_VERSION", sudoku.GENERATOR_VERSION + 1)
    P.main(args)
    assert "reusing the data" not in capsys.readouterr().out


def test_missing_split_names_the_command(tmp_path):
    with pytest.raises(SystemExit, match=r"python prepare_data.py --out_dir="):
        P.load_puzzles("train", str(tmp_path))
    with pytest.raises(SystemExit, match="no split or file named"):
        P.load_puzzles("nonsense")


def write(frame: pd.DataFrame, path: str, fmt: str) -> None:
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path, index=False)
    elif fmt == "jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        with open(path, "w") as f:
            f.write("# one puzzle a line, '0' blanks\n")
            for q in frame["question"]:
                f.write(q.replace(".", "0") + "\n\n")


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl", "txt"])
def test_each_format_round_trips(puzzles, tmp_path, fmt):
    frame = puzzles[["source", "question", "answer", "rating"]].iloc[:10]
    path = str(tmp_path / f"p.{fmt}")
    write(frame, path, fmt)
    loaded = P.load_puzzles(path)
    assert np.array_equal(loaded.question, sudoku.digits_to_tokens(digits(frame["question"])))
    if fmt == "txt":
        assert loaded.answer is None
    else:
        assert np.array_equal(loaded.answer, sudoku.digits_to_tokens(digits(frame["answer"])))
        assert list(loaded.frame["rating"]) == list(frame["rating"])


def test_file_source_computes_missing_answers(puzzles, tmp_path, capsys):
    path = str(tmp_path / "questions.csv")
    puzzles[["question"]].to_csv(path, index=False)  # hub CSV format without answers
    out = str(tmp_path / "out")
    P.main(["--source=file", "--path=" + path, "--out_dir=" + out, "--n_val=5", "--n_test=5", "--workers=1"])
    loaded = {s: P.load_puzzles(s, out) for s in P.SPLITS}
    assert [len(loaded[s]) for s in P.SPLITS] == [30, 5, 5]
    answers = np.concatenate([loaded[s].answer for s in P.SPLITS])
    assert np.array_equal(answers, sudoku.digits_to_tokens(digits(puzzles["answer"])))
    assert "val = next 5, test = last 5" in capsys.readouterr().out


def bad_rows(good_q: str, good_a: str) -> dict[str, tuple[str, str | None]]:
    """One (question, answer) per bad-input class."""
    relabelled = good_a.translate(str.maketrans("12", "21"))  # a valid grid, but clues 1/2 disagree
    a = list(good_a)
    a[0], a[1] = a[1], a[0]  # columns now repeat
    assert any(c in "12" for c in good_q)
    return {
        "wrong length": (good_q[:80], good_a),
        "bad character": ("x" + good_q[1:], good_a),
        "contradicting clues": ("11" + "." * 79, None),
        "answer not a valid grid": (good_q, "".join(a)),
        "answer disagrees with clues": (good_q, relabelled),
        "no solution": ("12345678." + "........9" + "." * 63, None),
        "several solutions": ("." * 81, None),
    }


def test_each_bad_input_class_is_named(puzzles, tmp_path, capsys):
    good_q, good_a = puzzles["question"][0], puzzles["answer"][0]
    cases = bad_rows(good_q, good_a)
    assert set(cases) == set(P.REASONS)
    for reason, (q, a) in cases.items():
        path = str(tmp_path / "bad.csv")
        pd.DataFrame({"question": [good_q, q], "answer": [good_a, a or ""]}).to_csv(path, index=False)
        with pytest.raises(SystemExit, match=f"bad.csv, row 2: {reason}"):
            P.main(["--source=file", "--path=" + path, "--out_dir=" + str(tmp_path / "o"), "--workers=1"])
    # --skip_invalid: all classes in one file, each dropped and counted
    rows = list(puzzles[["question", "answer"]].itertuples(index=False, name=None))
    rows += [(q, a or "") for q, a in cases.values()]
    path = str(tmp_path / "mixed.csv")
    pd.DataFrame(rows, columns=["question", "answer"]).to_csv(path, index=False)
    P.main(["--source=file", "--path=" + path, "--out_dir=" + str(tmp_path / "o"), "--skip_invalid", "--workers=1"])
    out = capsys.readouterr().out
    for reason in P.REASONS:
        assert f"dropped 1 x {reason}" in out
    assert sum(len(P.load_puzzles(s, str(tmp_path / "o"))) for s in P.SPLITS) == len(puzzles)


def test_load_puzzles_on_a_bad_file_names_file_row_reason(tmp_path):
    path = str(tmp_path / "list.txt")
    with open(path, "w") as f:
        f.write(NORVIG_HARD + "\n" + NORVIG_HARD[:-1] + "\n")
    with pytest.raises(SystemExit, match=r"list.txt, line 2: wrong length \(wrong length: a board has 81 cells, got 80\)"):
        P.load_puzzles(path)
    csv = str(tmp_path / "cols.csv")
    pd.DataFrame({"puzzle": [NORVIG_HARD]}).to_csv(csv, index=False)
    with pytest.raises(SystemExit, match="no 'question' column"):
        P.load_puzzles(csv)


def test_hub_path_offline_against_local_parquet(puzzles, tmp_path, monkeypatch, capsys):
    hub = tmp_path / "hub"
    hub.mkdir()
    puzzles.iloc[:30].to_parquet(hub / "train.parquet", index=False)
    puzzles.iloc[30:].to_parquet(hub / "test.parquet", index=False)
    monkeypatch.setenv("RELAY_SUDOKU_HF_DATASET", str(hub))
    out = str(tmp_path / "out")
    P.main(["--source=hf", "--out_dir=" + out, "--n_val=4"])
    loaded = {s: P.load_puzzles(s, out).frame for s in P.SPLITS}
    assert list(loaded["train"]["question"]) == list(puzzles["question"][:26])
    assert list(loaded["val"]["question"]) == list(puzzles["question"][26:30])  # held out from the end of train
    assert list(loaded["test"]["question"]) == list(puzzles["question"][30:])
    assert "val = the last 4 rows" in capsys.readouterr().out
    # a hub id while offline (conftest sets HF_HUB_OFFLINE): one line saying what to do instead
    monkeypatch.setenv("RELAY_SUDOKU_HF_DATASET", "someone/not-a-local-dir")
    with pytest.raises(SystemExit, match="--source=generate"):
        P.main(["--source=hf", "--out_dir=" + str(tmp_path / "o2")])


def test_hub_csv_like_sudoku_extreme_plus_local_derivation(puzzles, tmp_path, monkeypatch):
    hub = tmp_path / "sudoku-extreme"  # sapientinc's layout: train.csv / test.csv, answers are 81-digit numbers
    hub.mkdir()
    cols = ["source", "question", "answer", "rating"]
    puzzles[cols].iloc[:20].to_csv(hub / "train.csv", index=False)
    puzzles[cols].iloc[20:26].to_csv(hub / "test.csv", index=False)
    monkeypatch.setenv("RELAY_SUDOKU_HF_DATASET", str(hub))
    out = str(tmp_path / "out")
    P.main(["--source=hf", "--out_dir=" + out, "--n_val=2", "--derive", "--workers=1"])
    test = P.load_puzzles("test", out)
    assert list(test.frame["answer"]) == list(puzzles["answer"][20:26])
    assert test.frame["trajectory"].map(len).min() >= 2 and (test.frame["derive_status"] == "ok").all()


def test_derive_one_trajectory_and_solved_pitfall(puzzles, capsys):
    easy = puzzles.iloc[int(np.argmax([81 - q.count(".") for q in puzzles["question"]]))]  # most clues
    r = P.derive_one((easy["question"], easy["answer"], 10.0))
    assert r["derive_status"] == "ok" and r["trajectory"][0] == easy["question"] and r["trajectory"][-1] == easy["answer"]
    assert r["num_steps"] == len(r["trajectory"]) - 1 >= 1
    boards = digits(r["trajectory"])
    assert all((((a > 0) <= (b > 0)) & ((a == 0) | (a == b))).all() for a, b in zip(boards, boards[1:]))
    # pitfall 7.4: stepping an already solved board would add "Brute Force"
    assert "Brute Force" not in r["strategies_used"]
    solved = P.derive_one((easy["answer"], easy["answer"], 10.0))
    assert solved["num_steps"] == 0 and solved["strategies_used"] == []
    assert "Made progress" not in capsys.readouterr().out  # the solver's console is silenced


def test_derive_one_time_limit_counts_as_brute_force():
    answer = sudoku.format_board(sudoku.solve(sudoku.parse_board(NORVIG_HARD)))
    r = P.derive_one((NORVIG_HARD, answer, 1e-4))
    assert r["derive_status"] == "timeout" and "Brute Force" in r["strategies_used"]
    assert r["trajectory"][-1] == answer and r["num_steps"] == len(r["trajectory"]) - 1


def test_derive_cli_adds_fields_and_cohorts(data_dir, tmp_path, capsys):
    out = str(tmp_path / "d")
    P.main(["--out_dir=" + out, "--seed=3", "--workers=1", *SIZES])
    P.main(["--out_dir=" + out, "--seed=3", "--workers=1", *SIZES, "--derive"])
    printed = capsys.readouterr().out
    assert "adding the derived fields" in printed and "deduction_only" in printed
    frame = P.load_puzzles("test", out).frame
    assert {"trajectory", "num_steps", "strategies_used", "derive_status"} <= set(frame.columns)
    assert list(frame["question"]) == list(P.load_puzzles("test", data_dir).frame["question"])
    assert all(t[0] == q and t[-1] == a for t, q, a in zip(frame["trajectory"], frame["question"], frame["answer"]))
    mask = P.deduction_only_mask(frame)
    assert mask.dtype == bool and mask.shape == (len(frame),)


def test_deduction_only_mask_forms_and_rules():
    frame = pd.DataFrame({"strategies_used": [
        ["Single Candidate", "Naked Pairs"],            # advanced, no brute force -> in
        np.array(["Naked Pairs", "Brute Force"]),       # brute force -> out
        "['Single Position', 'X-Wing']",                # text form, singular master -> in
        "Single Candidate, Candidate Lines",            # easy/medium only -> out
        {"Swordfish"},                                  # master -> in
        " hidden triple ",                              # singular, spaces -> in
        [],                                             # nothing -> out
    ]})
    assert P.deduction_only_mask(frame).tolist() == [True, False, True, False, True, True, False]
    assert [P.hardest_tier(v) for v in frame["strategies_used"]] == [
        "Advanced", "Brute Force", "Master", "Medium", "Master", "Advanced", "none"]
    with pytest.raises(ValueError, match="prepare_data.py --derive"):
        P.deduction_only_mask(pd.DataFrame({"question": [NORVIG_HARD]}))


def test_task_sft_dispatches_to_fastdllm_data(monkeypatch):
    seen = {}
    fake = types.ModuleType("fastdllm_data")
    fake.main = lambda argv: seen.setdefault("argv", argv)
    monkeypatch.setitem(sys.modules, "fastdllm_data", fake)
    P.main(["--task=sft", "--out_dir=x", "--n=3"])
    assert seen["argv"] == ["--out_dir=x", "--n=3"]


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    for argv in (["--min_clues=40", "--max_clues=30"], ["--source=file"], ["--source=file", "--path=/nope.csv"]):
        with pytest.raises(SystemExit):
            P.main(argv + ["--out_dir=" + str(tmp_path)])
        assert "error:" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(tmp_path, "meta.json"))


def test_meta_records_arguments(data_dir):
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["key"]["seed"] == 3 and meta["key"]["n_train"] == 40 and meta["derived"] is False
