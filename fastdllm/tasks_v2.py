"""The code task of Table 2 in miniature, v2 (docs/table2_miniature.md): multi-step list pipelines.

A task chains STAGES steps, each a filter and a map over a list of integers, then a reducer, stated step by step
in a HumanEval-style stub (signature, docstring, one example):

    def tally_values(nums):
        \"\"\"Step 1: take the elements of nums that are even and map each to its square.
        Step 2: take the elements of the list from step 1 that are greater than 5 and map each to itself minus 2.
        Step 3: take every element of the list from step 2 and map each to itself.
        Step 4: return the sum of the values from step 3.
        >>> tally_values([3, 4, 1, 2])
        14
        \"\"\"

The answer is the whole function in one of two styles: inline loops, or one helper function per step (each with
its own loop) called in turn; names are drawn at random and must stay consistent across lines and blocks. The
answers are 100-250 tokens long (4-8 blocks of 32), so the number of forward passes has room to shrink.

Two things are held out of every training and validation file, each fixed once by a seed:
- operation pairs: HELDOUT_PAIRS of the 9 x 10 (filter, map) pairs; a task whose steps use one of them is of a
  held-out composition (the test set is made only of those);
- wording: every operation is described in PHRASINGS ways; the last one is never trained on. The test tasks are
  written twice, in trained wording (phrasings 0-2 drawn at random) and in the held-out wording.
Tasks are written in EvalPlus' format (base_input / plus_input; the judge computes the expected outputs by running
the canonical solution) for `eval_code.py --data_path`.
"""
import functools
import itertools
import random
import re
from typing import NamedTuple

from fastdllm.prompt import training_messages
from fastdllm.tasks import FILTERS as V1_FILTERS, MAPS as V1_MAPS, draw_inputs, draw_list, write_jsonl  # noqa: F401

# Each operation's phrasings; {S} is the list a step reads ("nums", "the list from step 1", "the values from step 3"), {k} a constant.
# The last phrasing of each (index HELDOUT_PHRASING) appears in no training or validation file.
FILTER_WORDS = {
    "all": ("every element of {S}", "all the elements of {S}", "each element of {S}", "the elements of {S}, all of them"),
    "even": ("the elements of {S} that are even", "the even elements of {S}", "the elements of {S} with an even value",
             "the elements of {S} that are not odd"),
    "odd": ("the elements of {S} that are odd", "the odd elements of {S}", "the elements of {S} with an odd value",
            "the elements of {S} that are not even"),
    "positive": ("the elements of {S} that are positive", "the positive elements of {S}",
                 "the elements of {S} above zero", "the elements of {S} that are strictly greater than 0"),
    "negative": ("the elements of {S} that are negative", "the negative elements of {S}",
                 "the elements of {S} below zero", "the elements of {S} that are strictly less than 0"),
    "greater": ("the elements of {S} that are greater than {k}", "the elements of {S} above {k}",
                "the elements of {S} exceeding {k}", "the elements of {S} that are larger than {k}"),
    "less": ("the elements of {S} that are less than {k}", "the elements of {S} below {k}",
             "the elements of {S} under {k}", "the elements of {S} that are smaller than {k}"),
    "divisible": ("the elements of {S} that are divisible by {k}", "the multiples of {k} in {S}",
                  "the elements of {S} that {k} divides evenly", "the elements of {S} leaving no remainder when divided by {k}"),
    "indivisible": ("the elements of {S} that are not divisible by {k}", "the elements of {S} that are not multiples of {k}",
                    "the elements of {S} that {k} does not divide evenly",
                    "the elements of {S} leaving a nonzero remainder when divided by {k}"),
}
MAP_WORDS = {
    "same": ("map each to itself", "keep each as it is", "leave each unchanged", "pass each through untouched"),
    "square": ("map each to its square", "replace each with its square", "square each of them",
               "multiply each by itself"),
    "cube": ("map each to its cube", "replace each with its cube", "cube each of them",
             "raise each to the third power"),
    "times": ("map each to itself times {k}", "multiply each by {k}", "replace each with {k} times itself",
              "scale each by a factor of {k}"),
    "plus": ("map each to itself plus {k}", "add {k} to each", "increase each by {k}", "shift each up by {k}"),
    "minus": ("map each to itself minus {k}", "subtract {k} from each", "decrease each by {k}", "shift each down by {k}"),
    "abs": ("map each to its absolute value", "replace each with its absolute value", "take the absolute value of each",
            "drop the sign of each"),
    "negate": ("map each to its negative", "negate each of them", "flip the sign of each", "replace each with minus itself"),
    "mod": ("map each to its remainder modulo {k}", "replace each with its remainder after division by {k}",
            "reduce each modulo {k}", "map each to what is left over when it is divided by {k}"),
    "floordiv": ("map each to itself floor-divided by {k}", "floor-divide each by {k}",
                 "replace each with the floor of itself over {k}", "divide each by {k}, rounding down"),
}
REDUCER_WORDS = {
    "sum": ("return the sum of {S}", "return the total of {S}", "add up {S} and return the result",
            "return what {S} add up to"),
    "product": ("return the product of {S}", "multiply {S} together and return the result",
                "return {S} multiplied together", "return the result of multiplying all of {S}"),
    "max": ("return the largest of {S}, or 0 if there are none", "return the maximum of {S}, or 0 when there are none",
            "return the biggest of {S}, or 0 for no values", "return the highest of {S} (0 if there is none)"),
    "min": ("return the smallest of {S}, or 0 if there are none", "return the minimum of {S}, or 0 when there are none",
            "return the least of {S}, or 0 for no values", "return the lowest of {S} (0 if there is none)"),
    "list": ("return {S} as a list, in order", "return the list of {S}, in order", "return {S} in a list, keeping their order",
             "return {S}, ordered as they came, in a list"),
    "count": ("return how many of {S} there are", "return the number of {S}", "return the count of {S}",
              "return the length of {S}"),
}
PHRASINGS = 4
HELDOUT_PHRASING = PHRASINGS - 1
TRAINED_PHRASINGS = tuple(range(HELDOUT_PHRASING))
STAGES = 3  # filter-and-map steps before the reducer
HELDOUT_PAIR_SHARE = 0.2
HELDOUT_SEED = 4321  # fixed once: changing it changes which (filter, map) pairs are never trained on
STYLES = ("loop", "helpers")
FIRST = "Step 1: take {filter} and {map}."
LATER = "Step {i}: take {filter} and {map}."
LAST = "Step {i}: {reducer}."

VERBS = ("compute", "calc", "get", "find", "tally", "process", "reduce", "collect", "evaluate", "summarize", "measure",
         "score", "combine", "fold", "transform")
NOUNS = ("values", "items", "data", "numbers", "entries", "stats", "result", "total", "list", "seq", "batch", "scores",
         "points", "records", "elements")
ARGS = ("nums", "xs", "values", "items", "data", "arr", "lst", "numbers", "seq", "ints", "vals")
LOOP_VARS = ("x", "v", "n", "item", "val", "num", "e", "y", "elem", "t", "z")
STAGE_NAMES = ("kept", "part", "stage", "cur", "mid", "sel", "chosen", "picked", "work", "step", "tmp", "buf")
HELPER_VERBS = ("prepare", "clean", "select", "shape", "refine", "adjust", "pick", "convert", "sift", "update")
ACC_NAMES = ("total", "acc", "result", "res", "answer", "out")


class Step(NamedTuple):
    filter: str
    map: str
    kf: int  # the filter's constant (unused when it has none)
    km: int  # the map's constant


class Task(NamedTuple):
    steps: tuple[Step, ...]
    reducer: str
    name: str  # function name
    xs: str  # argument name
    v: str  # loop variable
    lists: tuple[str, ...]  # the intermediate lists' names (loop style) or the helpers' names (helpers style)
    acc: str
    style: str
    wording: tuple[int, ...]  # the phrasing of each step's filter and map, then the reducer's


def pairs() -> list[tuple[str, str]]:
    return list(itertools.product(FILTER_WORDS, MAP_WORDS))


@functools.cache
def heldout_pairs() -> frozenset[tuple[str, str]]:
    """The (filter, map) pairs no training or validation task may contain (a fixed draw)."""
    all_ = pairs()
    return frozenset(random.Random(HELDOUT_SEED).sample(all_, round(HELDOUT_PAIR_SHARE * len(all_))))


def is_heldout(t: Task) -> bool:
    return any((s.filter, s.map) in heldout_pairs() for s in t.steps)


def draw_steps(rng: random.Random, heldout: bool) -> tuple[Step, ...]:
    """STAGES steps; heldout=True: at least one step's pair is held out; False: none is."""
    allowed = [p for p in pairs() if p not in heldout_pairs()]
    chosen = [rng.choice(allowed) for _ in range(STAGES)]
    if heldout:
        chosen[rng.randrange(STAGES)] = rng.choice(sorted(heldout_pairs()))
    return tuple(Step(f, m, rng.randint(2, 9), rng.randint(2, 9)) for f, m in chosen)


def draw_task(rng: random.Random, heldout: bool, wording: str = "trained") -> Task:
    """A task of a held-out composition (heldout=True) or of a training one, in trained or held-out wording."""
    steps = draw_steps(rng, heldout)
    reducer = rng.choice(sorted(REDUCER_WORDS))
    xs = rng.choice(ARGS)
    v = rng.choice([n for n in LOOP_VARS if n != xs])
    style = rng.choice(STYLES)
    pool = STAGE_NAMES if style == "loop" else HELPER_VERBS
    lists = tuple(rng.sample([n for n in pool if n not in (xs, v)], STAGES))
    acc = rng.choice([n for n in ACC_NAMES if n not in (xs, v)])
    n_phrases = 2 * STAGES + 1
    phrases = (HELDOUT_PHRASING,) * n_phrases if wording == "heldout" else tuple(
        rng.choice(TRAINED_PHRASINGS) for _ in range(n_phrases))
    return Task(steps, reducer, f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}", xs, v, lists, acc, style, phrases)


def reword(t: Task, rng: random.Random, wording: str) -> Task:
    """The same task (names, constants, style) in another wording: what the paired wording test compares."""
    n_phrases = len(t.wording)
    phrases = (HELDOUT_PHRASING,) * n_phrases if wording == "heldout" else tuple(
        rng.choice(TRAINED_PHRASINGS) for _ in range(n_phrases))
    return t._replace(wording=phrases)


# -----------------------------------------------------------------------------
# the stub (what the model reads) and the code (what it writes)


def subject(t: Task, i: int) -> str:
    """What step i + 1 reads: the argument, the list the step before made, or (the reducer) its values."""
    if i == 0:
        return t.xs
    return f"the values from step {i}" if i == STAGES else f"the list from step {i}"


def spec_lines(t: Task) -> list[str]:
    lines = []
    for i, s in enumerate(t.steps):
        words_f = FILTER_WORDS[s.filter][t.wording[2 * i]].format(S=subject(t, i), k=s.kf)
        words_m = MAP_WORDS[s.map][t.wording[2 * i + 1]].format(k=s.km)
        lines.append((FIRST if i == 0 else LATER).format(i=i + 1, filter=words_f, map=words_m))
    words_r = REDUCER_WORDS[t.reducer][t.wording[-1]].format(S=subject(t, STAGES))
    lines.append(LAST.format(i=STAGES + 1, reducer=words_r))
    return lines


def stub(t: Task, example: list[int]) -> str:
    """The HumanEval-style prompt: signature and docstring (the steps and one example)."""
    doc = "".join(f"    {line}\n" for line in spec_lines(t))
    return (f"def {t.name}({t.xs}):\n    \"\"\"{doc.lstrip()}    >>> {t.name}({example})\n    {run(t, example)!r}\n"
            f"    \"\"\"\n")


def condition(s: Step, v: str) -> str | None:
    cond = V1_FILTERS[s.filter][1]
    return cond.format(v=v, k=s.kf) if cond else None


def expression(s: Step, v: str) -> str:
    return V1_MAPS[s.map][1].format(v=v, k=s.km)


def stage_loop(src: str, dst: str, s: Step, v: str, indent: str) -> list[str]:
    """The lines that build list dst from list src by one step (a loop with an optional condition)."""
    cond = condition(s, v)
    lines = [f"{dst} = []", f"for {v} in {src}:"]
    if cond:
        lines += [f"    if {cond}:", f"        {dst}.append({expression(s, v)})"]
    else:
        lines.append(f"    {dst}.append({expression(s, v)})")
    return [indent + line for line in lines]


def reducer_lines(t: Task, src: str) -> list[str]:
    """The reducer over list src, as a loop (loop style) or a builtin (helpers style)."""
    r, acc, v = t.reducer, t.acc, t.v
    if t.style == "helpers":
        return [{"sum": f"return sum({src})", "product": f"return math.prod({src})",
                 "max": f"return max({src}, default=0)", "min": f"return min({src}, default=0)",
                 "list": f"return {src}", "count": f"return len({src})"}[r]]
    if r in ("list", "count"):
        return [f"return {src}" if r == "list" else f"return len({src})"]
    if r in ("max", "min"):
        op = ">" if r == "max" else "<"
        return [f"{acc} = None", f"for {v} in {src}:", f"    if {acc} is None or {v} {op} {acc}:", f"        {acc} = {v}",
                f"return 0 if {acc} is None else {acc}"]
    init, update = ("0", f"{acc} += {v}") if r == "sum" else ("1", f"{acc} *= {v}")
    return [f"{acc} = {init}", f"for {v} in {src}:", f"    {update}", f"return {acc}"]


def code(t: Task) -> str:
    """The answer: the whole program in the task's style (no docstring)."""
    if t.style == "loop":
        body, src = [], t.xs
        for s, dst in zip(t.steps, t.lists):
            body += stage_loop(src, dst, s, t.v, "")
            src = dst
        body += reducer_lines(t, src)
        return f"def {t.name}({t.xs}):\n" + "".join(f"    {line}\n" for line in body)
    helpers = []
    for s, helper in zip(t.steps, t.lists):
        lines = stage_loop(t.xs, "out", s, t.v, "") + ["return out"]
        helpers.append(f"def {helper}({t.xs}):\n" + "".join(f"    {line}\n" for line in lines))
    call = t.xs
    for helper in t.lists:
        call = f"{helper}({call})"
    main = [f"{t.acc} = {call}" if t.reducer != "list" else f"return {call}"]
    if t.reducer != "list":
        main += reducer_lines(t, t.acc)
    head = "import math\n\n\n" if t.reducer == "product" else ""
    return head + "\n\n".join(helpers) + f"\n\ndef {t.name}({t.xs}):\n" + "".join(f"    {line}\n" for line in main)


def run(t: Task, xs: list[int]):
    """The task's answer on xs, computed from its code (the canonical solution)."""
    namespace = {}
    exec(code(t), namespace)
    return namespace[t.name](list(xs))


# -----------------------------------------------------------------------------
# rows: EvalPlus test tasks and training conversations


def evalplus_row(t: Task, task_id: str, rng: random.Random, split: str) -> dict:
    """An EvalPlus task (eval_code.py --data_path). The canonical solution continues the stub's def line, so it is
    always the loop style's body (the expected outputs do not depend on the style)."""
    example = draw_list(rng, -9, 20, 3, 6)
    base, plus = draw_inputs(rng)
    body = code(t._replace(style="loop")).split("\n", 1)[1]
    return dict(task_id=task_id, prompt=stub(t, example), entry_point=t.name, canonical_solution=body,
                base_input=base, plus_input=plus, atol=0, example=example, steps=[list(s[:2]) for s in t.steps], reducer=t.reducer,
                style=t.style, wording=list(t.wording), split=split)


def sft_row(t: Task, rng: random.Random, source: str) -> dict:
    """A training conversation: the stub in eval_code.py's prompt wrapper, the program as the answer."""
    return {"messages": training_messages(stub(t, draw_list(rng, -9, 20, 3, 6)), code(t)), "source": source}


# -----------------------------------------------------------------------------
# reading a spec back (what the held-out checks use, independently of how the rows were written)


@functools.cache
def phrase_patterns() -> list[tuple[str, str, int, re.Pattern]]:
    """(kind, operation, phrasing, pattern) for every phrasing; the subject and constants are wildcards."""
    def words(template: str) -> str:
        return (re.escape(template).replace(r"\{S\}", r"(?:\w+|the (?:list|values) from step \d)")
                .replace(r"\{k\}", r"\d+"))
    out = []
    for kind, table in (("filter", FILTER_WORDS), ("map", MAP_WORDS), ("reducer", REDUCER_WORDS)):
        for op, phrasings in table.items():
            out += [(kind, op, i, re.compile(words(p))) for i, p in enumerate(phrasings)]
    return out


def parse_step(sentence: str) -> list[tuple[str, str, int]]:
    """Every (kind, operation, phrasing) whose words make up one step sentence exactly (an ambiguous sentence
    gives several readings; text that is not a step gives none)."""
    m = re.fullmatch(r"Step \d: take (.+) and (.+)\.", sentence)
    if m:
        return [(k, op, i) for part, kinds in ((m.group(1), "filter"), (m.group(2), "map"))
                for k, op, i, pat in phrase_patterns() if k == kinds and pat.fullmatch(part)]
    m = re.fullmatch(r"Step \d: (.+)\.", sentence)
    return [(k, op, i) for k, op, i, pat in phrase_patterns() if k == "reducer" and m and pat.fullmatch(m.group(1))]


def read_spec(text: str) -> list[list[tuple[str, str, int]]]:
    """The readings of every "Step N: ..." line in text (a prompt or a whole conversation)."""
    return [parse_step(line.strip().lstrip('"')) for line in text.splitlines() if re.match(r'\s*(?:""")?Step \d: ', line)]
