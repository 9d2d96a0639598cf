"""Table 2 in miniature: the task family, the held-out compositions, the tokenizer and the judge on the tasks."""
import io
import json
import random
import types
import zipfile

import pytest

import fastdllm.judge
from fastdllm import mini_corpus, mini_data, tasks
from fastdllm.model import MASK_TOKEN, check_tokenizer, make_tiny_tokenizer
from helpers import FILTER_MEANING, MAP_MEANING  # an independent reading of the spec's words


def reduce_meaning(reducer: str, ys: list[int]):
    if reducer == "sum":
        return sum(ys)
    if reducer == "product":
        out = 1
        for y in ys:
            out = out * y
        return out
    if reducer in ("max", "min"):
        return (sorted(ys)[-1 if reducer == "max" else 0]) if ys else 0
    if reducer == "list":
        return list(ys)
    return len(set(ys))


def meaning(t: tasks.Task, xs: list[int]):
    kept = [v for v in xs if FILTER_MEANING[t.comp.filter](v, t.kf)]
    return reduce_meaning(t.comp.reducer, [MAP_MEANING[t.comp.map](v, t.km) for v in kept])


# what the spec's words give for no elements at all: a sum and a product of nothing, "or 0 if there are none", no list
EMPTY_ANSWER = {"sum": 0, "product": 1, "max": 0, "min": 0, "list": [], "distinct": 0}


def test_every_composition_in_both_styles_computes_what_its_spec_says():
    rng = random.Random(0)
    for comp in tasks.compositions():
        for style in tasks.STYLES:
            t = tasks.draw_task(comp, rng)._replace(style=style)
            for _ in range(6):
                xs = tasks.draw_list(rng, -20, 30, 0, 9)
                assert tasks.run(t, xs) == meaning(t, xs), (comp, style, xs, tasks.code(t))


def test_every_test_task_is_judged_on_the_empty_list():
    """The empty list is among the plus inputs of every composition's test task, in both styles, and the task's
    canonical solution (prompt + canonical_solution, as the judge runs it) returns there what the spec says. Fails
    with the empty list dropped from tasks.draw_inputs (checked: every row), or with the loop style's max / min
    returning its accumulator unguarded (checked: None instead of 0)."""
    rng = random.Random(7)
    for comp in tasks.compositions():
        for style in tasks.STYLES:
            row = tasks.evalplus_row(tasks.draw_task(comp, rng)._replace(style=style), "mini/seen/0", rng, "seen")
            assert [[]] in row["plus_input"], (comp, row["plus_input"])
            namespace = {}
            exec(row["prompt"] + row["canonical_solution"], namespace)
            assert namespace[row["entry_point"]]([]) == EMPTY_ANSWER[comp.reducer], (comp, style)


def test_the_prompt_states_the_spec_and_a_true_example():
    t = tasks.Task(tasks.Composition("even", "square", "sum"), "tally_values", "nums", "n", "total", 3, 4, "loop")
    assert tasks.stub(t, [3, 4, 1, 2]) == (
        'def tally_values(nums):\n    """Take the elements of nums that are even, map each to its square, and return '
        'their sum.\n    >>> tally_values([3, 4, 1, 2])\n    20\n    """\n')
    assert tasks.code(t) == ("def tally_values(nums):\n    total = 0\n    for n in nums:\n        if n % 2 == 0:\n"
                             "            total += n * n\n    return total\n")


def test_names_never_collide_and_each_style_is_drawn():
    rng = random.Random(1)
    drawn = [tasks.draw_task(rng.choice(tasks.compositions()), rng) for _ in range(2000)]
    assert all(len({t.xs, t.v, t.acc}) == 3 for t in drawn)
    assert {t.style for t in drawn} == set(tasks.STYLES)


def test_parse_spec_reads_back_every_composition_and_nothing_else():
    rng = random.Random(2)
    for comp in tasks.compositions():
        assert tasks.parse_spec(tasks.stub(tasks.draw_task(comp, rng), [1, 2, 3])) == comp
    assert tasks.parse_spec("def f(xs):\n    \"\"\"Return the sum of xs.\"\"\"\n") is None


def test_a_fifth_of_the_compositions_is_held_out_and_every_part_is_still_trained():
    held = tasks.heldout_compositions()
    assert len(held) == 108 == round(0.2 * 540)
    trained = set(tasks.compositions()) - held
    for i, part in enumerate((tasks.FILTERS, tasks.MAPS, tasks.REDUCERS)):
        assert {c[i] for c in trained} == set(part)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The task files as mini_data.build_tasks writes them, at small counts, with the byte tokenizer and a
    two-file corpus standing in for the code corpus."""
    out = tmp_path_factory.mktemp("mini")
    corpus = [dict(split="train", text='def area(w, h):\n    """The area of a w by h rectangle."""\n    a = w * h\n'
                                          '    return a\n'),
              dict(split="heldout", text='def half(x):\n    """Half of x."""\n    y = x / 2\n    return y\n')]
    args = mini_data.parse_args([f"--out_dir={out}", "--n_tasks_train=600", "--n_adapt_tasks=300", "--n_test_each=40",
                                  "--max_tokens=1200"])  # the byte tokenizer: about 4 tokens per BPE token
    mini_data.build_tasks(args, make_tiny_tokenizer(), corpus)
    return out


def read(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_held_out_compositions_are_absent_from_every_training_file(built):
    held = tasks.heldout_compositions()
    for name in ("tasks_train.jsonl", "adapt.jsonl"):
        rows = read(built / name)
        prompts = [r["messages"][0]["content"] for r in rows]
        read_back = [tasks.parse_spec(p) for p in prompts]
        task_rows = [c for c, r in zip(read_back, rows) if r["source"] == "tasks"]
        assert task_rows and all(c is not None for c in task_rows)  # every task row is recognised
        assert not [c for c in read_back if c in held], name
    test = read(built / "test.jsonl")
    assert {tasks.parse_spec(r["prompt"]) in held for r in test if r["split"] == "heldout"} == {True}
    assert {tasks.parse_spec(r["prompt"]) in held for r in test if r["split"] == "seen"} == {False}


def test_the_docstring_pairs_come_from_the_train_split_only(built):
    answers = [r["messages"][1]["content"] for r in read(built / "adapt.jsonl") if r["source"] == "docstrings"]
    assert len(answers) == 1 and "def area(w, h):\n    a = w * h\n    return a" in answers[0]


def test_held_out_test_tasks_can_be_rebuilt_without_the_corpus(built):
    test = [r for r in read(built / "test.jsonl") if r["split"] == "heldout"]
    again = tasks.heldout_tests(len(test), random.Random(mini_data.TEST_SEED))
    assert again == test


def test_seen_test_tasks_skip_every_function_a_training_row_has():
    train = [c for c in tasks.compositions() if c not in tasks.heldout_compositions()]
    free = mini_data.test_rows(1, train, seed=5, avoid=set())
    first = free[1]["prompt"].split("\n")[0] + "\n" + free[1]["canonical_solution"]  # the first seen task drawn
    taken = mini_data.test_rows(1, train, seed=5, avoid={first})
    assert taken[0] == free[0] and taken[1]["prompt"] != free[1]["prompt"]


def test_the_tokenizer_has_the_fast_dllm_special_ids():
    texts = ["def f(x):\n    return x + 1\n"] * 50 + ["import os\nprint(os.getcwd())\n"] * 50
    tok = mini_corpus.train_tokenizer(texts, vocab_size=300)
    assert tok.convert_tokens_to_ids(list(mini_corpus.SPECIALS)) == [0, 1, 2, 3]
    assert (tok.pad_token, tok.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert tok.convert_tokens_to_ids(MASK_TOKEN) == 3
    check_tokenizer(tok, type("Config", (), {"mask_token_id": 3})())
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    # the mask never comes out of ordinary text, even text that spells it
    assert 3 not in tok("|<MASK >| <|im_end >|", add_special_tokens=False)["input_ids"]


def test_the_judge_scores_hand_made_right_and_wrong_programs(tmp_path):
    t = tasks.Task(tasks.Composition("greater", "minus", "max"), "top_gap", "xs", "v", "best", 4, 2, "loop")
    row = tasks.evalplus_row(t, "mini/heldout/0", random.Random(3), "heldout")
    row["base_input"] = [[[5, 9, 1]], [[7, 7, 2]]]  # hand-computed answers: 7 and 5
    row["plus_input"] = [[[]], [[1, 2, 3]], [[10, 30, -2]]]  # 0, 0 (nothing above 4), 28
    right = "def top_gap(xs):\n    m = [x - 2 for x in xs if x > 4]\n    return max(m) if m else 0\n"
    no_default = "def top_gap(xs):\n    return max(x - 2 for x in xs if x > 4)\n"  # fails on an empty selection
    wrong = "def top_gap(xs):\n    return max([x for x in xs if x > 4], default=0)\n"  # forgets the map
    crash = "def top_gap(xs):\n    return xs[99]\n"
    verdicts = fastdllm.judge.judge_solutions([row] * 4, [right, no_default, wrong, crash], True, workers=1,
                                              cache_dir=str(tmp_path))
    assert [(v["base"], v["plus_inputs"]) for v in verdicts] == [(True, True), (True, False), (False, False),
                                                                   (False, False)]


def fake_wheel(source: str) -> bytes:
    """A small wheel: one module, its source given."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("fake_pkg/__init__.py", source)
    return buffer.getvalue()


def test_a_wheel_whose_sha256_differs_from_its_pin_is_refused(tmp_path, monkeypatch):
    """The corpus builder checks every wheel against its pinned sha256, one pip has just downloaded and one found in
    the cache alike, and takes the pinned bytes. No network: pip is replaced by a stand-in that writes the wheel.
    Fails with the digest check removed from mini_corpus.fetch_wheels (checked)."""
    pinned, other = fake_wheel("X = 1\n"), fake_wheel("X = 2\n")
    monkeypatch.setattr(mini_corpus, "PACKAGES", (("fake-pkg", "1.0", mini_corpus.sha256_bytes(pinned)),))
    cache = tmp_path / "wheels"
    wheel = cache / "fake_pkg-1.0-py3-none-any.whl"
    asked = []

    def pip_download(cmd, **kwargs):  # what `pip download` does, with other bytes than the pin's
        asked.append(cmd)
        wheel.write_bytes(other)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")
    monkeypatch.setattr(mini_corpus, "subprocess", types.SimpleNamespace(run=pip_download))
    with pytest.raises(ValueError, match=r"fake_pkg-1.0-py3-none-any.whl has sha256 .*, pinned"):
        mini_corpus.fetch_wheels(str(cache))  # downloaded
    assert len(asked) == 1 and "fake-pkg==1.0" in asked[0]
    with pytest.raises(ValueError, match="pinned"):
        mini_corpus.fetch_wheels(str(cache))  # found in the cache: not downloaded again, still refused
    assert len(asked) == 1
    wheel.write_bytes(pinned)
    assert mini_corpus.fetch_wheels(str(cache)) == [str(wheel)]
