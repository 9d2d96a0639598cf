"""Table 2 in miniature: the paper's Fast-dLLM v2 chain rebuilt small on real code, through the project's own code paths.

    python scripts/table2/mini_study.py                  # all of it, from nothing, resumable (2 cores: about 5.5 h)
    python scripts/table2/mini_study.py --report_only    # tables and figures from the kept results (--out)
    python scripts/table2/mini_study.py --gate           # the task's difficulty check (pass@1 at tau 0.99 in 20-80%?)
    python scripts/table2/mini_study.py --smoke          # toy sizes: the whole pipeline in a few minutes
    python scripts/table2/mini_study.py --device=cuda --lanes=10 --out=results/mini_study_gpu   # on a GPU, every run at once

What it does, each step skipped when its output is there (a killed study resumes; docs/table2_miniature.md):
0. the data: `python -m fastdllm.mini_data` (corpus, tokenizer, instruction mixture, tasks);
A. pretraining: `scripts/table2/pretrain_ar.py`, a 2.6M-parameter Qwen2 on the code corpus (the stand-in for Qwen2.5);
B. adaptation: `train_fastdllm.py config/fastdllm_mini_adapt.py` (the Fast-dLLM v2 objective; the table's base row),
   under torchrun with one process per lane;
   A and B are kept as bf16 checkpoint directories in --kept (the repository's reference/mini/), and the next stage
   always starts from the kept copy, so a study resumed on a fresh clone goes on from the same weights;
C. fine-tunes from B, `train_fastdllm.py config/fastdllm_mini_<objective>.py`: vanilla SFT and Relay with each of
   --seeds, then the --extra objectives with the first seed; equal steps x batch (equal compute, as in the paper);
   --lanes at once, one thread each (with --device=cuda all on the one GPU, and B in one process);
D. evaluation: `eval_code.py` on the test tasks (block 32, sub-block 8): every kept step with the light protocol,
   the last one (and B) with the full protocol; one small JSON per (model, step, tau) in --out;
then the report (scripts/table2/mini_report.py): Table 2's columns, the frontier, pass@1 at matched NFE, the gap against
fine-tuning compute, in --out/mini_study.md. The final seed-1 SFT and Relay pair is kept in --kept too.
"""
import argparse
import json
import os
import queue
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import common  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.table2 import mini_report  # noqa: E402

PY = sys.executable
OBJECTIVES = ("sft", "relay", "rollout", "relay_sg")
CARRY = {"sft": False, "rollout": False, "relay_sg": True, "relay": True}  # decode with the relay carry
FULL = {"taus": (0.5, 0.7, 0.85, 0.95, 0.99), "per_split": 200}
LIGHT = {"taus": (0.7, 0.85, 0.99), "per_split": 100}
GATE = {"taus": (0.99,), "per_split": 100}
SMOKE_DATA = ["--n_tasks_train=400", "--n_adapt_tasks=200", "--n_test_each=8"]
SMOKE_PRETRAIN = ["--max_iters=20", "--eval_interval=10", "--log_interval=5", "--warmup_iters=2", "--n_layer=2",
                  "--n_embd=64", "--d_ff=128", "--batch_size=4", "--seq_len=64"]
SMOKE_FINETUNE = ["--max_iters=4", "--save_interval=2", "--warmup_iters=1", "--lr_decay_iters=4", "--device_batch_size=2",
                  "--effective_batch=0"]
SMOKE_PROTOCOL = {"taus": (0.7, 0.99), "per_split": 4}
FOLDERS = {"data_dir": "data/mini", "runs": "runs/mini", "kept": "reference/mini", "out": "results/mini_study"}
SMOKE_FOLDERS = {"data_dir": "data/mini-smoke", "runs": "runs/mini-smoke", "kept": "runs/mini-smoke/kept",
                 "out": "runs/mini-smoke/results"}
GATE_STEPS, SMOKE_GATE_STEPS = 400, 2
GATE_DATA = ("tasks_train.jsonl", "test.jsonl")  # what the gate reads from --data_dir
EVAL_ARGS = ["--dataset=humaneval", "--block_size=32", "--sub_block_size=8", "--max_new_tokens=128", "--batch_size=32",
             "--dtype=float32", "--workers=1", "--decode=authors"]


def run_name(objective: str, seed: int) -> str:
    return f"{objective}_s{seed}"


def plan(seeds: list[int], extra: list[str]) -> list[tuple[str, int]]:
    """The jobs in the order the lanes take them: the base model's evaluation (("base", 0), so that no lane waits
    for it), then the fine-tunes, SFT and Relay seed by seed, then the extra objectives."""
    return [("base", 0)] + [(o, s) for s in seeds for o in ("sft", "relay")] + [(o, seeds[0]) for o in extra]


def is_complete(ckpt_dir: str) -> bool:
    return os.path.isfile(os.path.join(ckpt_dir, "manifest.json"))


def manifest_step(ckpt_dir: str) -> int:
    """The step in ckpt_dir's manifest, read by the verifying reader: a damaged manifest stops in one line."""
    try:
        manifest = common.read_manifest(ckpt_dir, fields=("files", "step"),
                                        way_out="restore it from a copy (reference/mini/: git checkout), or train it again")
    except common.CheckpointError as e:
        raise SystemExit(str(e)) from None
    if manifest is None:
        raise SystemExit(f"{os.path.join(ckpt_dir, common.MANIFEST)} is missing: the directory is not complete")
    return manifest["step"]


def keep(src: str, dst: str) -> None:
    """A bf16 copy of the checkpoint directory src at dst (config, weights, tokenizer, manifest), written beside
    and swapped in: what the next stage starts from, and what the repository keeps. Skipped when dst already
    holds src's step (a resumed study)."""
    import torch
    from fastdllm.model import load_fastdllm, save_fastdllm
    step = manifest_step(src)
    if is_complete(dst) and manifest_step(dst) == step:
        verify_kept(dst)
        return print(f"{dst} holds step {step} already, kept")
    try:
        model, tokenizer = load_fastdllm(src, dtype=torch.bfloat16)
    except (ValueError, OSError) as e:  # common.CheckpointError and the loader's other refusals: one line
        raise SystemExit(f"cannot keep {src}: {str(e).strip().splitlines()[0]}") from None
    save_fastdllm(model, tokenizer, dst + ".tmp", info={"step": step})
    common.swap_in(dst + ".tmp", dst)
    print(f"kept {src} as {dst} (bf16)")


def verify_kept(folder: str) -> None:
    """Every file of a kept checkpoint against its manifest (no file missing, none added, none changed)."""
    way_out = "restore it (git checkout), or delete it and the study keeps it again"
    try:
        common.verify_manifest(folder, common.read_manifest(folder, fields=("files", "step"), way_out=way_out), way_out)
    except common.CheckpointError as e:
        raise SystemExit(str(e)) from None


def stage_a(args: argparse.Namespace) -> None:
    kept = os.path.join(args.kept, "pretrain")
    if is_complete(kept):
        return print(f"stage A: {kept} is kept, skipped")
    out = os.path.join(args.runs, "pretrain")
    resume = ["--resume=True"] if os.path.exists(os.path.join(out, "resume")) else []
    runs.sh([PY, "scripts/table2/pretrain_ar.py", f"--data_dir={args.data_dir}", f"--out_dir={out}", *args.pretrain_args,
             *resume], log=os.path.join(args.runs, "pretrain.log"))
    keep_log(out, "pretrain", args)
    keep(os.path.join(out, "model"), kept)


def keep_log(run_dir: str, name: str, args: argparse.Namespace) -> None:
    """The run's metrics.jsonl (losses, held-out perplexity, tokens/s) among the kept results."""
    os.makedirs(os.path.join(args.out, name), exist_ok=True)
    shutil.copyfile(os.path.join(run_dir, "metrics.jsonl"), os.path.join(args.out, name, "train_metrics.jsonl"))


def last_ckpt(run_dir: str) -> str | None:
    steps = kept_steps(run_dir)
    return os.path.join(run_dir, f"ckpt-{steps[-1]}") if steps else None


def kept_steps(run_dir: str) -> list[int]:
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    return sorted(int(n[5:]) for n in names if n.startswith("ckpt-") and n[5:].isdigit()
                  and is_complete(os.path.join(run_dir, n)))


def finetune(config: str, out: str, extra: list[str], lanes: int, log: str, echo: bool = True) -> None:
    """train_fastdllm.py until its max_iters (resumed from out/resume when there is one), one process per lane."""
    launch = [PY, "train_fastdllm.py"] if lanes == 1 else [PY, "-m", "torch.distributed.run", "--standalone",
                                                             f"--nproc_per_node={lanes}", "train_fastdllm.py"]
    done = os.path.join(out, "DONE.json")
    if os.path.exists(done):
        return
    resume = ["--resume=True"] if os.path.exists(os.path.join(out, "resume")) else []
    if not resume and os.path.exists(os.path.join(out, "metrics.jsonl")):
        # killed before its first checkpoint: only log lines are there, so it starts again from scratch
        print(f"{out}: interrupted before its first checkpoint; starting it again", flush=True)
        resume = ["--overwrite=True"]
    runs.sh(launch + [config, f"--out_dir={out}", *extra, *resume], log=log, echo=echo)
    runs.write_marker(done, {"cmd": [config, *extra]})


def processes(args: argparse.Namespace) -> int:
    """Processes for one run of B or the gate: a lane each on the CPU; one on a GPU, which needs no sharing."""
    return args.lanes if args.device == "cpu" else 1


def stage_b(args: argparse.Namespace) -> None:
    kept = os.path.join(args.kept, "adapt")
    if is_complete(kept):
        return print(f"stage B: {kept} is kept, skipped")
    out = os.path.join(args.runs, "adapt")
    procs = processes(args)
    per_process = max(1, 4 // procs) if procs in (1, 2, 4) else 1
    extra = [f"--init_from={os.path.join(args.kept, 'pretrain')}", f"--data={args.data_dir}/adapt.jsonl",
             f"--gradient_accumulation_steps={per_process}", *args.finetune_args]
    if procs not in (1, 2, 4):
        extra.append("--effective_batch=0")
    finetune("config/fastdllm_mini_adapt.py", out, extra, procs, os.path.join(args.runs, "adapt.log"))
    keep_log(out, "base", args)
    keep(last_ckpt(out), kept)


def evaluate(model_dir: str, name: str, step: int, carry: bool, protocol: dict, label: str,
             args: argparse.Namespace) -> None:
    """eval_code.py at each tau of the protocol; each result compacted into one kept JSON (mini_report.result_path)."""
    test = test_file(args, protocol["per_split"])
    for tau in protocol["taus"]:
        kept = mini_report.result_path(args.out, name, step, tau, label)
        if os.path.exists(kept):
            continue
        out = os.path.join(args.runs, "eval", name, f"step_{step}", f"{label}_tau_{tau:g}")
        runs.sh([PY, "eval_code.py", f"--model={model_dir}", f"--data_path={test}", f"--threshold={tau}",
                 f"--relay_carry={carry}", f"--out_dir={out}", f"--gt_cache_dir={args.runs}/gt_cache", *EVAL_ARGS,
                 f"--device={args.device}"],
                log=os.path.join(args.runs, "eval", f"{name}.log"), echo=False)
        mini_report.compact(out, kept, dict(model=name, step=step, tau=tau, protocol=label, relay_carry=carry))


def test_file(args: argparse.Namespace, per_split: int) -> str:
    """The first per_split tasks of held-out and of seen compositions from the data's test.jsonl."""
    path = os.path.join(args.runs, f"test_{per_split}.jsonl")
    if not os.path.exists(path):
        with open(os.path.join(args.data_dir, "test.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        chosen = [r for split in ("heldout", "seen") for r in [r for r in rows if r["split"] == split][:per_split]]
        os.makedirs(args.runs, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in chosen)
        os.replace(path + ".tmp", path)
    return path


def fine_tune_and_evaluate(objective: str, seed: int, args: argparse.Namespace, say) -> None:
    """Train one fine-tune, evaluate its kept steps, and keep the first seed's SFT and Relay."""
    name = run_name(objective, seed)
    out = os.path.join(args.runs, name)
    say(f"fine-tuning (log: {args.runs}/{name}.log)")
    finetune(f"config/fastdllm_mini_{objective}.py", out,
             [f"--seed={seed}", f"--init_from={os.path.join(args.kept, 'adapt')}",
              f"--data={args.data_dir}/tasks_train.jsonl", *args.finetune_args],
             1, os.path.join(args.runs, f"{name}.log"), echo=False)
    keep_log(out, name, args)
    steps = kept_steps(out)
    say(f"trained; evaluating steps {steps}")
    for step in steps:
        evaluate(os.path.join(out, f"ckpt-{step}"), name, step, CARRY[objective], args.light, "light", args)
    evaluate(os.path.join(out, f"ckpt-{steps[-1]}"), name, steps[-1], CARRY[objective], args.full, "full", args)
    if seed == args.seeds[0] and objective in ("sft", "relay"):
        keep(os.path.join(out, f"ckpt-{steps[-1]}"), os.path.join(args.kept, name))
    say(f"evaluated; results in {args.out}/{name}")


def lane(number: int, todo: "queue.Queue", args: argparse.Namespace, failures: list) -> None:
    """Take jobs from the queue until it is empty or a lane has failed: evaluate the base model, or train one
    fine-tune and then evaluate its kept steps. Any failure is recorded in failures as one line naming the run, so
    that run_all stops the study with it; what finished before stays kept."""
    while not failures:
        try:
            objective, seed = todo.get_nowait()
        except queue.Empty:
            return
        name = "base" if objective == "base" else run_name(objective, seed)
        say = lambda text: print(f"[lane {number}] {time.strftime('%H:%M')} {name}: {text}", flush=True)  # noqa: E731
        try:
            if objective == "base":
                evaluate(os.path.join(args.kept, "adapt"), "base", 0, False, args.full, "full", args)
            else:
                fine_tune_and_evaluate(objective, seed, args, say)
        # BaseException: anything a job raises (a failed command's SystemExit, a bug's exception, safetensors'
        # panics) would otherwise end this thread alone and the study would exit 0 without the lane's later runs;
        # KeyboardInterrupt reaches the main thread only, so nothing here swallows Ctrl-C
        except BaseException as e:  # noqa: BLE001
            failures.append(f"{name}: {runs.one_line(e)}")
            say(f"FAILED: {runs.one_line(e)}")


def prepare(args: argparse.Namespace) -> None:
    """The data, then stage A (what both the study and the gate start from)."""
    runs.sh([PY, "-m", "fastdllm.mini_data", f"--out_dir={args.data_dir}", *(SMOKE_DATA if args.smoke else [])])
    os.makedirs(os.path.join(args.runs, "eval"), exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.lanes))
    stage_a(args)


def run_all(args: argparse.Namespace) -> None:
    prepare(args)
    stage_b(args)
    todo: queue.Queue = queue.Queue()
    for item in plan(args.seeds, args.extra):
        todo.put(item)
    failures: list[str] = []
    threads = [threading.Thread(target=lane, args=(i + 1, todo, args, failures)) for i in range(args.lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit("the study stopped: " + "; ".join(failures))


def gate(args: argparse.Namespace) -> None:
    """SFT from the pretrained model straight on the task rows (16 per step), then pass@1 at tau 0.99 on 100 tasks of
    held-out and 100 of seen compositions: the task is fit for the study when both land in 20-80%."""
    if not args.gate_init:
        prepare(args)
    init = args.gate_init or os.path.join(args.kept, "pretrain")
    out = os.path.join(args.runs, "gate")
    os.makedirs(os.path.join(args.runs, "eval"), exist_ok=True)
    per_process = max(1, 2 // processes(args))
    finetune("config/fastdllm_mini_adapt.py", out,
             [f"--init_from={init}", f"--data={args.data_dir}/tasks_train.jsonl", f"--max_iters={args.gate_steps}",
              f"--lr_decay_iters={args.gate_steps}", f"--save_interval={args.gate_steps}",
              f"--gradient_accumulation_steps={per_process}", "--effective_batch=0", *args.finetune_args],
             processes(args), os.path.join(args.runs, "gate.log"))
    evaluate(last_ckpt(out), "gate", args.gate_steps, False, SMOKE_PROTOCOL if args.smoke else GATE, "gate", args)
    mini_report.print_gate(args.out)


def check_modes(args: argparse.Namespace) -> None:
    """--gate, --report_only and --smoke: flags one of them would ignore or replace, refused in one line."""
    if args.gate and args.report_only:
        raise SystemExit("--gate and --report_only: give one of them")
    if args.gate_init and not args.gate:
        raise SystemExit(f"--gate_init={args.gate_init} is read by --gate only: add --gate, or drop it")
    given = [f"--{key}" for key in (*FOLDERS, "gate_steps") if getattr(args, key) is not None]
    if args.smoke and given:
        raise SystemExit(f"{', '.join(given)}: --smoke sets its own (folders under runs/mini-smoke, "
                         f"gate steps {SMOKE_GATE_STEPS}); drop {'them' if len(given) > 1 else 'it'}")


def check_gate_inputs(args: argparse.Namespace) -> None:
    """With --gate_init the gate builds nothing: its model and the task files must be there already (else
    torchrun starts and fails on the missing file a minute later)."""
    if not args.gate_init:
        return
    if not is_complete(args.gate_init):
        raise SystemExit(f"--gate_init={args.gate_init} is not a checkpoint directory (no manifest.json): give "
                         "scripts/table2/pretrain_ar.py's out_dir/model or a kept one")
    missing = [name for name in GATE_DATA if not os.path.isfile(os.path.join(args.data_dir, name))]
    if missing:
        raise SystemExit(f"--data_dir={args.data_dir} lacks {', '.join(missing)} (the gate with --gate_init builds no "
                         f"data): python -m fastdllm.mini_data --out_dir={args.data_dir}")


def torch_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--seeds", default="1,2,3", help="seeds of SFT and Relay")
    p.add_argument("--extra", default="rollout,relay_sg", help="objectives fine-tuned once (first seed); '' for none")
    p.add_argument("--lanes", type=int, default=2, help="runs at once (one per core; on a GPU, every run: 10)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: every stage on the one GPU, fp32")
    p.add_argument("--data_dir", help=f"default {FOLDERS['data_dir']}")
    p.add_argument("--runs", help=f"default {FOLDERS['runs']}")
    p.add_argument("--kept", help=f"the kept bf16 checkpoints of stages A, B and the seed-1 pair (default {FOLDERS['kept']})")
    p.add_argument("--out", help=f"kept results and the report (default {FOLDERS['out']})")
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--gate", action="store_true", help="only the task's difficulty check")
    p.add_argument("--gate_init", default="", help="the model the gate fine-tunes (default: the kept stage A)")
    p.add_argument("--gate_steps", type=int, help=f"16 task rows per step (default {GATE_STEPS})")
    p.add_argument("--smoke", action="store_true", help="toy sizes, in runs/mini-smoke")
    args = p.parse_args(argv)
    check_modes(args)
    for key, default in (SMOKE_FOLDERS if args.smoke else FOLDERS).items():
        setattr(args, key, getattr(args, key) or default)
    args.gate_steps = SMOKE_GATE_STEPS if args.smoke else GATE_STEPS if args.gate_steps is None else args.gate_steps
    args.seeds = runs.seed_list(args.seeds, "--seeds")
    args.extra = [o.strip() for o in args.extra.split(",") if o.strip()]
    bad = [o for o in args.extra if o not in OBJECTIVES[2:]]
    if bad or len(set(args.extra)) < len(args.extra):
        raise SystemExit(f"--extra: each of {', '.join(OBJECTIVES[2:])} at most once, got {','.join(args.extra)!r}")
    runs.need(args.lanes >= 1, "--lanes", ">= 1", args.lanes)
    runs.need(args.gate_steps >= 1, "--gate_steps", ">= 1", args.gate_steps)
    check_gate_inputs(args)
    # evaluation skips a (model, step, tau) whose JSON is kept, so a broken one would stop the report only at the end
    mini_report.load(args.out)
    runs.need(args.device == "cpu" or (args.device == "cuda" and torch_cuda()), "--device", "cpu, or cuda on a GPU",
              args.device)
    args.full, args.light, args.pretrain_args, args.finetune_args = FULL, LIGHT, [], []
    if args.smoke:
        args.full = args.light = SMOKE_PROTOCOL
        args.pretrain_args, args.finetune_args = SMOKE_PRETRAIN, SMOKE_FINETUNE
    args.pretrain_args = [*args.pretrain_args, f"--device={args.device}"]
    args.finetune_args = [*args.finetune_args, f"--device={args.device}"]
    for key in ("data_dir", "runs", "kept", "out"):
        runs.check_folder(getattr(args, key), f"--{key}")
        setattr(args, key, os.path.relpath(os.path.abspath(getattr(args, key)), runs.ROOT))
    if args.gate_init:  # main() runs from the repository root, like the folders above
        args.gate_init = os.path.relpath(os.path.abspath(args.gate_init), runs.ROOT)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(runs.ROOT)
    if args.gate:
        return gate(args)
    if not args.report_only:
        run_all(args)
    mini_report.report(args.out)


if __name__ == "__main__":
    main()
