"""Table 2 in miniature v2: the multi-step task family, its held-out pairs and wording, the data files and the judge."""
import json
import random

import pytest

import fastdllm.judge
from eval_code import to_solution
from fastdllm import mini_data_v2, tasks_v2
from fastdllm.model import make_tiny_tokenizer
from helpers import FILTER_MEANING, MAP_MEANING

REDUCER_MEANING = {"sum": sum, "list": list, "count": len, "max": lambda ys: sorted(ys)[-1] if ys else 0,
                   "min": lambda ys: sorted(ys)[0] if ys else 0}


def meaning(t: tasks_v2.Task, xs: list[int]):
    """What the steps say, read independently of the generator's code templates."""
    for s in t.steps:
        xs = [MAP_MEANING[s.map](v, s.km) for v in xs if FILTER_MEANING[s.filter](v, s.kf)]
    if t.reducer == "product":
        out = 1
        for y in xs:
            out = out * y
        return out
    return REDUCER_MEANING[t.reducer](xs)


def test_every_task_in_both_styles_computes_what_its_steps_say():
    rng = random.Random(7)
    for i in range(300):
        t = tasks_v2.draw_task(rng, heldout=i % 2 == 0)
        for style in tasks_v2.STYLES:
            for xs in ([], [0], [3, 4, 1, 2], [-7, 12, 9, 0, 5, 18, -3], [20, 20, -9]):
                assert tasks_v2.run(t._replace(style=style), xs) == meaning(t, xs), (t, style, xs)


def test_answers_are_long_enough_to_cut_forward_passes():
    rng = random.Random(3)
    sizes = [len(tasks_v2.code(tasks_v2.draw_task(rng, heldout=False))) for _ in range(400)]
    assert min(sizes) > 200 and sum(sizes) / len(sizes) > 350  # characters; about 3.2 per token of the mini BPE


def test_every_phrasing_reads_back_as_its_own_operation_only():
    """The held-out checks read prompts back; each phrasing must name one operation and one phrasing."""
    for kind, table in (("filter", tasks_v2.FILTER_WORDS), ("map", tasks_v2.MAP_WORDS)):
        for op, phrasings in table.items():
            assert len(phrasings) == tasks_v2.PHRASINGS
            for i in range(tasks_v2.PHRASINGS):
                t = tasks_v2.Task((tasks_v2.Step("all", "same", 3, 3),) * 3, "sum", "f", "xs", "v", ("a", "b", "c"),
                                  "acc", "loop", (0,) * 7)
                steps = list(t.steps)
                steps[1] = tasks_v2.Step(op if kind == "filter" else "all", op if kind == "map" else "same", 4, 5)
                wording = [0] * 7
                wording[2 if kind == "filter" else 3] = i
                readings = tasks_v2.read_spec(tasks_v2.stub(t._replace(steps=tuple(steps), wording=tuple(wording)), [1]))
                assert (kind, op, i) in readings[1] and len(readings[1]) == 2, (kind, op, i, readings[1])
    for op, phrasings in tasks_v2.REDUCER_WORDS.items():
        for i in range(tasks_v2.PHRASINGS):
            t = tasks_v2.Task((tasks_v2.Step("all", "same", 3, 3),) * 3, op, "f", "xs", "v", ("a", "b", "c"), "acc",
                              "loop", (0,) * 6 + (i,))
            assert tasks_v2.read_spec(tasks_v2.stub(t, [1]))[-1] == [("reducer", op, i)]


def test_a_fifth_of_the_pairs_is_held_out_and_every_operation_is_still_trained():
    held = tasks_v2.heldout_pairs()
    assert len(held) == 18 == round(0.2 * 90)
    trained = set(tasks_v2.pairs()) - held
    assert {f for f, _ in trained} == set(tasks_v2.FILTER_WORDS) and {m for _, m in trained} == set(tasks_v2.MAP_WORDS)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The v2 files as mini_data_v2.build writes them, at small counts, with the byte tokenizer and a two-file corpus
    standing in for the code corpus."""
    out = tmp_path_factory.mktemp("mini2")
    corpus = [dict(split="train", text='def area(w, h):\n    """The area of a w by h rectangle."""\n    a = w * h\n'
                                          '    return a\n'),
              dict(split="heldout", text='def half(x):\n    """Half of x."""\n    y = x / 2\n    return y\n')]
    (out / "corpus").mkdir()
    args = mini_data_v2.parse_args([f"--corpus_dir={out}/corpus", f"--out_dir={out}/data", "--n_train=500",
                                     "--n_adapt_tasks=50", "--n_val=60", "--n_val_rows=20", "--n_test=60",
                                     "--max_tokens=2000"], check_corpus=False)  # byte tokenizer: ~4x the BPE's tokens
    mini_data_v2.build_files(args, make_tiny_tokenizer(), corpus)
    return out / "data"


def read(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def readings(text: str) -> list[tuple[str, str, int]]:
    """Every (kind, operation, phrasing) of every step of text; each step must read back exactly."""
    steps = tasks_v2.read_spec(text)
    assert len(steps) == tasks_v2.STAGES + 1 and all(len(s) == (2 if i < tasks_v2.STAGES else 1)
                                                      for i, s in enumerate(steps)), text
    return [r for step in steps for r in step]


def step_pairs(text: str) -> set[tuple[str, str]]:
    steps = tasks_v2.read_spec(text)[:tasks_v2.STAGES]
    return {(step[0][1], step[1][1]) for step in steps}


def test_held_out_pairs_and_wording_are_absent_from_every_training_and_validation_file(built):
    held = tasks_v2.heldout_pairs()
    checked = 0
    for name in ("train.jsonl", "adapt.jsonl", "val_rows.jsonl"):
        for row in read(built / name):
            text = row["messages"][0]["content"]
            if row["source"] == "docstrings":
                assert not tasks_v2.read_spec(text)
                continue
            assert not step_pairs(text) & held, name
            assert all(i != tasks_v2.HELDOUT_PHRASING for _, _, i in readings(text)), name
            checked += 1
    for row in read(built / "val.jsonl"):
        assert not step_pairs(row["prompt"]) & held
        assert all(i != tasks_v2.HELDOUT_PHRASING for _, _, i in readings(row["prompt"]))
        checked += 1
    assert checked == 500 + 50 + 20 + 60


def test_the_test_tasks_are_held_out_compositions_written_in_both_wordings(built):
    held = tasks_v2.heldout_pairs()
    test, reworded = read(built / "test.jsonl"), read(built / "test_reworded.jsonl")
    assert all(step_pairs(r["prompt"]) & held for r in test)
    assert all(i != tasks_v2.HELDOUT_PHRASING for r in test for _, _, i in readings(r["prompt"]))
    assert all(i == tasks_v2.HELDOUT_PHRASING for r in reworded for _, _, i in readings(r["prompt"]))
    same = ("task_id", "entry_point", "canonical_solution", "base_input", "plus_input", "example")
    assert [{k: r[k] for k in same} for r in test] == [{k: r[k] for k in same} for r in reworded]
    assert all(a["prompt"] != b["prompt"] for a, b in zip(test, reworded))
    assert [step_pairs(a["prompt"]) for a in test] == [step_pairs(b["prompt"]) for b in reworded]


def test_validation_and_test_programs_are_disjoint_and_new(built):
    def program(row: dict) -> str:
        return row["prompt"].split("\n")[0] + "\n" + row["canonical_solution"]
    val, test = {program(r) for r in read(built / "val.jsonl")}, {program(r) for r in read(built / "test.jsonl")}
    assert len(val) == 60 and len(test) == 60 and not val & test


def test_a_new_task_skips_every_program_already_taken():
    first = tasks_v2.draw_task(random.Random(5), heldout=False)  # what new_tasks draws first from this seed
    rng = random.Random(5)
    tasks_v2.draw_task(rng, heldout=False)
    second = tasks_v2.draw_task(rng, heldout=False)  # the draw after it, when the first is skipped
    assert mini_data_v2.new_tasks(1, random.Random(5), False, set(), "v", "val")[0][0] == first
    assert mini_data_v2.new_tasks(1, random.Random(5), False, {tasks_v2.code(first)}, "v", "val")[0][0] == second


def test_the_validation_rows_are_the_first_validation_tasks(built):
    rows, val = read(built / "val_rows.jsonl"), read(built / "val.jsonl")
    assert len(rows) == 20
    for row, task in zip(rows, val):
        assert task["prompt"].split(">>>")[0].strip() in row["messages"][0]["content"]


def test_the_judge_passes_both_styles_and_fails_a_missing_step(tmp_path):
    t = tasks_v2.Task((tasks_v2.Step("even", "square", 2, 2), tasks_v2.Step("greater", "minus", 5, 2),
                       tasks_v2.Step("all", "negate", 3, 3)), "min", "score_items", "xs", "v", ("prep", "clean", "pick"),
                      "best", "helpers", (0,) * 7)
    row = tasks_v2.evalplus_row(t, "mini2/test/0", random.Random(3), "test")
    row["base_input"] = [[[4, 6, 1]], [[2, 3]]]  # hand-computed: 16, 36 -> 14, 34 -> -14, -34 -> -34; 4 -> none -> 0
    row["plus_input"] = [[[]], [[10, 8]], [[3, 2]]]  # 0; 100, 64 -> 98, 62 -> -98, -62 -> -98; 4 -> none -> 0
    helpers = tasks_v2.code(t)
    loop = tasks_v2.code(t._replace(style="loop"))
    missing = loop.replace("v > 5", "True")  # drops step 2's filter
    solutions = [to_solution(c + "\n```\n", row) for c in (helpers, loop, missing)]
    assert "def prep" in solutions[0] and "def pick" in solutions[0]  # the helpers survive the sanitiser
    verdicts = fastdllm.judge.judge_solutions([row] * 3, solutions, True, workers=1, cache_dir=str(tmp_path))
    assert [(v["base"], v["plus_inputs"]) for v in verdicts] == [(True, True), (True, True), (False, False)]


def test_the_test_tasks_can_be_rebuilt_without_the_corpus(built):
    rows = [r for _, r in mini_data_v2.test_tasks(60, mini_data_v2.SEED)]
    assert rows == read(built / "test.jsonl")
    assert [mini_data_v2.reworded(r, t) for t, r in mini_data_v2.test_tasks(60)] == read(built / "test_reworded.jsonl")
