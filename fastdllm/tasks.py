"""The verifiable code task of Table 2 in miniature (docs/table2_miniature.md): MBPP-style list functions.

A task composes a filter, a map and a reducer over a list of integers, described in words in a
HumanEval-style stub (signature, docstring with the spec and one example):

    def tally_values(nums):
        \"\"\"Take the elements of nums that are even, map each to its square, and return their sum.
        >>> tally_values([3, 4, 1, 2])
        20
        \"\"\"

The answer is the whole function, written in one of two styles (a loop, or a comprehension / builtin),
with names drawn at random (function, argument, loop variable, accumulator): the tokens of one block
depend on each other (a style or a name chosen once must be kept), which is where committing several
tokens per forward can go wrong (paper Sec. 1). 9 filters x 10 maps x 6 reducers = 540 compositions;
HELDOUT_SHARE of them, drawn once with a fixed seed, never appear in any training file.
Tasks are written in EvalPlus' format (base_input / plus_input; the judge computes the expected
outputs by running the canonical solution) for `eval_code.py --data_path`.
"""
import functools
import itertools
import json
import os
import random
import re
from typing import NamedTuple

from fastdllm.prompt import training_messages

# filter: (words after "Take", condition on the loop variable {v}); {xs} is the argument, {k} a constant
FILTERS = {
    "all": ("every element of {xs}", None),
    "even": ("the elements of {xs} that are even", "{v} % 2 == 0"),
    "odd": ("the elements of {xs} that are odd", "{v} % 2 == 1"),
    "positive": ("the elements of {xs} that are positive", "{v} > 0"),
    "negative": ("the elements of {xs} that are negative", "{v} < 0"),
    "greater": ("the elements of {xs} that are greater than {k}", "{v} > {k}"),
    "less": ("the elements of {xs} that are less than {k}", "{v} < {k}"),
    "divisible": ("the elements of {xs} that are divisible by {k}", "{v} % {k} == 0"),
    "indivisible": ("the elements of {xs} that are not divisible by {k}", "{v} % {k} != 0"),
}
# map: (words after "map each to", expression of {v})
MAPS = {
    "same": ("itself", "{v}"),
    "square": ("its square", "{v} * {v}"),
    "cube": ("its cube", "{v} ** 3"),
    "times": ("itself times {k}", "{v} * {k}"),
    "plus": ("itself plus {k}", "{v} + {k}"),
    "minus": ("itself minus {k}", "{v} - {k}"),
    "abs": ("its absolute value", "abs({v})"),
    "negate": ("its negative", "-{v}"),
    "mod": ("its remainder modulo {k}", "{v} % {k}"),
    "floordiv": ("itself floor-divided by {k}", "{v} // {k}"),
}
# reducer: words after "and return"; its accumulator names are drawn from REDUCER_NAMES
REDUCERS = {
    "sum": "their sum",
    "product": "their product",
    "max": "the largest of them, or 0 if there are none",
    "min": "the smallest of them, or 0 if there are none",
    "list": "them as a list, in order",
    "distinct": "the number of distinct values among them",
}
REDUCER_NAMES = {
    "sum": ("total", "acc", "s", "result", "res", "answer"),
    "product": ("prod", "acc", "p", "result", "res", "answer"),
    "max": ("best", "biggest", "top", "result", "m", "answer"),
    "min": ("best", "smallest", "low", "result", "m", "answer"),
    "list": ("out", "result", "res", "acc", "kept", "answer"),
    "distinct": ("seen", "found", "uniq", "values_seen", "distinct", "pool"),
}
VERBS = ("compute", "calc", "get", "find", "tally", "process", "reduce", "collect", "evaluate", "summarize", "measure",
         "count", "score", "combine", "fold")
NOUNS = ("values", "items", "data", "numbers", "entries", "stats", "result", "total", "list", "seq", "batch", "scores",
         "points", "records", "elements")
ARGS = ("nums", "xs", "values", "items", "data", "arr", "lst", "numbers", "seq", "a", "ints", "vals")
LOOP_VARS = ("x", "v", "n", "item", "val", "num", "e", "y", "i", "elem", "t", "z")
SPEC = "Take {filter}, map each to {map}, and return {reducer}."
HELDOUT_SHARE = 0.2
HELDOUT_SEED = 1234  # fixed once: changing it changes which compositions are never trained on
STYLES = ("loop", "compact")


class Composition(NamedTuple):
    filter: str
    map: str
    reducer: str


def compositions() -> list[Composition]:
    return [Composition(*c) for c in itertools.product(FILTERS, MAPS, REDUCERS)]


def heldout_compositions() -> set[Composition]:
    """The compositions no training file may contain (HELDOUT_SHARE of them, a fixed draw)."""
    all_ = compositions()
    return set(random.Random(HELDOUT_SEED).sample(all_, round(HELDOUT_SHARE * len(all_))))


def needs_k(template: str | None) -> bool:
    return template is not None and "{k}" in template


class Task(NamedTuple):
    comp: Composition
    name: str  # function name
    xs: str  # argument name
    v: str  # loop variable
    acc: str  # accumulator
    kf: int  # the filter's constant (unused when it has none)
    km: int  # the map's constant
    style: str


def draw_task(comp: Composition, rng: random.Random) -> Task:
    """Random names, constants and style for a composition (names never collide with each other)."""
    name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
    xs = rng.choice(ARGS)
    v = rng.choice([n for n in LOOP_VARS if n != xs])
    acc = rng.choice([n for n in REDUCER_NAMES[comp.reducer] if n not in (xs, v)])
    return Task(comp, name, xs, v, acc, rng.randint(2, 9), rng.randint(2, 9), rng.choice(STYLES))


def spec_text(t: Task) -> str:
    words_f = FILTERS[t.comp.filter][0].format(xs=t.xs, k=t.kf)
    words_m = MAPS[t.comp.map][0].format(k=t.km)
    return SPEC.format(filter=words_f, map=words_m, reducer=REDUCERS[t.comp.reducer])


def parse_spec(text: str) -> Composition | None:
    """The composition a spec sentence describes (inverse of spec_text), None for any other text:
    what the held-out check reads from training prompts, independently of how they were written."""
    for comp, pattern in spec_patterns():
        if pattern.search(text):
            return comp
    return None


@functools.cache
def spec_patterns() -> list[tuple[Composition, re.Pattern]]:
    def words(template: str) -> str:
        return re.escape(template).replace(r"\{xs\}", r"\w+").replace(r"\{k\}", r"\d+")
    return [(c, re.compile(SPEC.format(filter=words(FILTERS[c.filter][0]), map=words(MAPS[c.map][0]),
                                       reducer=re.escape(REDUCERS[c.reducer])))) for c in compositions()]


def code(t: Task) -> str:
    """The answer: the whole function in the task's style (no docstring)."""
    cond = FILTERS[t.comp.filter][1]
    cond = cond.format(v=t.v, k=t.kf) if cond else None
    expr = MAPS[t.comp.map][1].format(v=t.v, k=t.km)
    head = f"def {t.name}({t.xs}):\n"
    return head + (loop_body(t, cond, expr) if t.style == "loop" else compact_body(t, cond, expr))


def loop_body(t: Task, cond: str | None, expr: str) -> str:
    r, acc = t.comp.reducer, t.acc
    init = {"sum": "0", "product": "1", "max": "None", "min": "None", "list": "[]", "distinct": "set()"}[r]
    op = ">" if r == "max" else "<"
    update = {"sum": [f"{acc} += {expr}"], "product": [f"{acc} *= {expr}"], "list": [f"{acc}.append({expr})"],
              "distinct": [f"{acc}.add({expr})"],
              "max": [f"if {acc} is None or {expr} {op} {acc}:", f"    {acc} = {expr}"],
              "min": [f"if {acc} is None or {expr} {op} {acc}:", f"    {acc} = {expr}"]}[r]
    lines = [f"{acc} = {init}", f"for {t.v} in {t.xs}:"]
    indent = "    "
    if cond:
        lines.append(f"    if {cond}:")
        indent = "        "
    lines += [indent + u for u in update]
    ret = {"distinct": f"len({acc})", "max": f"0 if {acc} is None else {acc}",
           "min": f"0 if {acc} is None else {acc}"}.get(r, acc)
    lines.append(f"return {ret}")
    return "".join(f"    {line}\n" for line in lines)


def compact_body(t: Task, cond: str | None, expr: str) -> str:
    gen = f"{expr} for {t.v} in {t.xs}" + (f" if {cond}" if cond else "")
    ret = {"sum": f"sum({gen})", "product": f"math.prod({gen})", "max": f"max(({gen}), default=0)",
           "min": f"min(({gen}), default=0)", "list": f"[{gen}]", "distinct": f"len({{{gen}}})"}[t.comp.reducer]
    body = f"    return {ret}\n"
    return body if t.comp.reducer != "product" else "    import math\n" + body


def run(t: Task, xs: list[int]):
    """The task's answer on xs, computed from its code (the canonical solution)."""
    namespace = {}
    exec(code(t), namespace)
    return namespace[t.name](list(xs))


def stub(t: Task, example: list[int]) -> str:
    """The HumanEval-style prompt: signature and docstring (spec and one example)."""
    return (f"def {t.name}({t.xs}):\n    \"\"\"{spec_text(t)}\n    >>> {t.name}({example})\n    {run(t, example)!r}\n"
            f"    \"\"\"\n")


def draw_list(rng: random.Random, lo: int, hi: int, n_lo: int, n_hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]


def draw_inputs(rng: random.Random) -> tuple[list, list]:
    """EvalPlus inputs (each a list of arguments): 5 base lists and 8 plus lists (empty, one element,
    long, all negative, large values)."""
    base = [[draw_list(rng, -9, 20, 3, 8)] for _ in range(5)]
    plus = [[[]], [draw_list(rng, -9, 20, 1, 1)], [draw_list(rng, -9, 20, 12, 16)], [draw_list(rng, -20, -1, 3, 8)],
            [draw_list(rng, -50, 99, 4, 10)], [draw_list(rng, 0, 9, 3, 8)], [draw_list(rng, -9, 20, 3, 8)],
            [draw_list(rng, -9, 20, 6, 10)]]
    return base, plus


def evalplus_row(t: Task, task_id: str, rng: random.Random, split: str) -> dict:
    example = draw_list(rng, -9, 20, 3, 6)
    base, plus = draw_inputs(rng)
    prompt = stub(t, example)
    solution = code(t)
    body = solution.split("\n", 1)[1]  # EvalPlus: canonical_solution continues the prompt (the stub's def line)
    return dict(task_id=task_id, prompt=prompt, entry_point=t.name, canonical_solution=body, base_input=base,
                plus_input=plus, atol=0, composition=list(t.comp), style=t.style, split=split)


def heldout_tests(n: int, rng: random.Random) -> list[dict]:
    """The first n test tasks of held-out compositions (task ids mini/heldout/0...): drawn before anything else
    from the test's own generator, so a check can rebuild them without the corpus or the training rows."""
    comps = sorted(heldout_compositions())
    return [evalplus_row(draw_task(rng.choice(comps), rng), f"mini/heldout/{i}", rng, "heldout") for i in range(n)]


def sft_row(t: Task, rng: random.Random) -> dict:
    """A training conversation: the stub in eval_code.py's prompt wrapper, the function as the answer."""
    return {"messages": training_messages(stub(t, draw_list(rng, -9, 20, 3, 6)), code(t)), "source": "tasks"}


def write_jsonl(rows: list[dict], path: str) -> None:
    with open(path + ".tmp", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(path + ".tmp", path)
