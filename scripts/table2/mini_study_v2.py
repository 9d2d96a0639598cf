"""Table 2 in miniature, v2: fine-tunes that converge, chosen on validation, on a task with room to cut NFE.

    python scripts/table2/mini_study_v2.py                  # all of it, resumable (2 cores: about 14 h)
    python scripts/table2/mini_study_v2.py --report_only    # the report from the kept JSONs (--out)
    python scripts/table2/mini_study_v2.py --smoke          # toy sizes: the whole pipeline in a few minutes
    python scripts/table2/mini_study_v2.py --device=cuda --lanes=8 --prebuilt --data_dir=data/mini2-gpu   # one GPU (docs/gpu.md)

The protocol, fixed before the seeds ran, is docs/table2_v2_protocol.md. Each step is skipped when its output is
there, so a killed study resumes with the same command; on another machine, where only what the repository keeps
is there (--out, --kept), a run whose every result is kept is not trained again, nor a pilot run the kept
choice.json did not choose:
0. the data: `python -m fastdllm.mini_data` (corpus and tokenizer), `python -m fastdllm.mini_data_v2` (the
   multi-step tasks: train, validation, test in trained and in held-out wording; stage B's mixture), or with
   --prebuilt the files carried; what C and D read must match the sha256 kept in --out/data.json;
A. the pretrained model, shared with v1 (reference/mini/pretrain, made by scripts/table2/pretrain_ar.py);
B. adaptation on docstring pairs and 8,000 task rows of training compositions: `train_fastdllm.py
   config/fastdllm_mini2_adapt.py`, kept in --kept as bf16;
P. the pilot: SFT and Relay, seed 1, at each learning rate of --lrs; each method's rate is the one whose run reaches
   the lower validation loss (choice.json); the chosen run is that method's seed 1;
C. SFT and Relay at their chosen rate with the other --seeds, then the --extra objectives (seed 1, Relay's rate);
D. every run's checkpoint of lowest validation loss, evaluated with eval_code.py: the test tasks in trained wording at
   each tau of --taus, in held-out wording at tau 0.85, the validation tasks at tau 0.85; stage B likewise.
One JSON per (run, protocol, tau) in --out; the report is --out/mini_study_v2.md (scripts/table2/mini_report_v2.py).
"""
import argparse
import gzip
import json
import os
import queue
import shutil
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import common  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.table2 import mini_report_v2, store  # noqa: E402

PY = sys.executable
OBJECTIVES = ("sft", "relay", "rollout", "relay_sg")
CARRY = store.CARRY
LRS = (3e-4, 1e-3)
TAUS = (0.7, 0.85, 0.95)
EVAL_ARGS = ["--dataset=humaneval", "--block_size=32", "--sub_block_size=8", "--max_new_tokens=224", "--batch_size=32",
             "--dtype=float32", "--decode=authors"]
# Stage B's mixture holds this many task rows of training compositions (none of the validation or test programs):
# the pre-registered band check failed without them (docs/table2_v2_protocol.md, "Added after the first pilot")
ADAPT_TASKS = 8000
SMOKE_DATA = ["--n_train=300", "--n_adapt_tasks=30", "--n_val=8", "--n_val_rows=4", "--n_test=8"]
SMOKE_FINETUNE = ["--max_iters=4", "--save_interval=2", "--val_interval=2", "--warmup_iters=1", "--lr_decay_iters=4",
                  "--device_batch_size=2", "--effective_batch=0"]


def run_name(objective: str, seed: int, lr: float | None = None) -> str:
    """sft_s3; a pilot run also names its rate (sft_s1_lr0.001) until it is chosen."""
    return f"{objective}_s{seed}" + (f"_lr{lr:g}" if lr is not None else "")


def val_losses(run_dir: str) -> dict[int, float]:
    """step -> validation loss, from the run's metrics.jsonl (train_fastdllm.py logs it at every save)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    records = store.read_jsonl(path) if os.path.exists(path) else []
    return {r["step"]: r["val_loss"] for r in records if "val_loss" in r}


def chosen_step(run_dir: str) -> int:
    """The kept checkpoint of lowest validation loss (a tie goes to the later step): the run's model."""
    losses = val_losses(run_dir)
    steps = [s for s in store.kept_steps(run_dir) if s in losses]
    if not steps:
        raise SystemExit(f"{run_dir}: no kept checkpoint has a validation loss in metrics.jsonl")
    return min(steps, key=lambda s: (losses[s], -s))


def choose_rate(runs_dir: str, objective: str, lrs: tuple[float, ...]) -> float:
    """The pilot's rule, the same for every objective: the rate whose seed-1 run reaches the lowest validation loss
    at any kept step (a tie goes to the smaller rate)."""
    best = {lr: min(val_losses(os.path.join(runs_dir, run_name(objective, 1, lr))).values()) for lr in lrs}
    return min(lrs, key=lambda lr: (best[lr], lr))


def train(args: argparse.Namespace, objective: str, seed: int, lr: float, name: str, say) -> str:
    out = os.path.join(args.runs, name)
    say(f"fine-tuning at lr {lr:g} (log: {args.runs}/{name}.log)")
    store.finetune(f"config/fastdllm_mini2_{objective}.py", out,
                        [f"--seed={seed}", f"--learning_rate={lr}", f"--init_from={os.path.join(args.kept, 'adapt')}",
                         f"--data={args.data_dir}/train.jsonl", f"--val_data={args.data_dir}/val_rows.jsonl",
                         *args.finetune_args], 1, os.path.join(args.runs, f"{name}.log"), echo=False)
    return out


VAL_TASKS = 200  # the validation tasks decoded per model (the first of val.jsonl)
FILES = {"test": "test.jsonl", "reworded": "test_reworded.jsonl", "val": "val.jsonl"}


def protocol(args: argparse.Namespace) -> list[tuple[str, float]]:
    """What each fine-tune is evaluated on: the test tasks in trained wording at each tau, in held-out wording at
    tau 0.85, the first VAL_TASKS validation tasks at tau 0.85."""
    return [("test", tau) for tau in args.taus] + [("reworded", 0.85), ("val", 0.85)]


def judge_workers(args: argparse.Namespace) -> int:
    """Processes that run the tests of one evaluation: on the CPU one per lane (a lane owns a core and decodes
    or judges); on a GPU the decoding is not on the cores, so the lanes share them all for the judging."""
    return 1 if args.device == "cpu" else max(1, (os.cpu_count() or 1) // args.lanes)


def evaluate(args: argparse.Namespace, model_dir: str, name: str, step: int, carry: bool,
             jobs: list[tuple[str, float]]) -> None:
    """eval_code.py for each (protocol, tau) of jobs; each result kept as one JSON (store.result_path)."""
    for protocol, tau in jobs:
        kept = store.result_path(args.out, name, step, tau, protocol)
        if os.path.exists(kept):
            continue
        out = os.path.join(args.runs, "eval", name, f"step_{step}", f"{protocol}_tau_{tau:g}")
        limit = [f"--limit={args.val_tasks}"] if protocol == "val" else []
        runs.sh([PY, "eval_code.py", f"--model={model_dir}", f"--data_path={args.data_dir}/{FILES[protocol]}", *limit,
                 f"--threshold={tau}", f"--relay_carry={carry}", f"--out_dir={out}",
                 f"--gt_cache_dir={args.runs}/gt_cache", *EVAL_ARGS, f"--device={args.device}",
                 f"--workers={judge_workers(args)}"],
                log=os.path.join(args.runs, "eval", f"{name}.log"), echo=False)
        store.compact(out, kept, dict(model=name, step=step, tau=tau, protocol=protocol, relay_carry=carry,
                                            device=args.device))


def finish(args: argparse.Namespace, objective: str, seed: int, run_dir: str, name: str, say) -> None:
    """Keep the run's log, evaluate its checkpoint of lowest validation loss, keep the seed-1 pair's weights."""
    store.keep_log(run_dir, name, args.out)
    step = chosen_step(run_dir)
    say(f"trained; validation chose step {step}; evaluating")
    ckpt = os.path.join(run_dir, f"ckpt-{step}")
    evaluate(args, ckpt, name, step, CARRY[objective], protocol(args))
    if seed == 1 and objective in ("sft", "relay"):
        store.keep(ckpt, os.path.join(args.kept, name))
    say(f"evaluated; results in {args.out}/{name}")


def pilot_job(args: argparse.Namespace, objective: str, lr: float, say) -> None:
    train(args, objective, 1, lr, run_name(objective, 1, lr), say)


def main_job(args: argparse.Namespace, objective: str, seed: int, say) -> None:
    """A run of the study proper: seed 1 is the pilot run at the chosen rate (not trained again)."""
    if finished(args, objective, seed):
        return say(f"every result is kept in {args.out}/{run_name(objective, seed)}; skipped")
    lr = args.choice["relay" if objective not in args.choice else objective]
    name = run_name(objective, seed)
    run_dir = os.path.join(args.runs, run_name(objective, 1, lr)) if seed == 1 and objective in args.choice else \
        train(args, objective, seed, lr, name, say)
    finish(args, objective, seed, run_dir, name, say)


def finished(args: argparse.Namespace, objective: str, seed: int) -> bool:
    """Whether the run's every result of protocol(args) is kept in --out at one step (and, for the seed-1 pair, its
    weights in --kept): what the repository keeps, so a study resumed on another machine does not train it again."""
    name = run_name(objective, seed)
    folder = os.path.join(args.out, name)
    steps = {store.read_kept(os.path.join(folder, f))["step"] for f in os.listdir(folder)
             if f.startswith("step_")} if os.path.isdir(folder) else set()
    kept = any(all(os.path.exists(store.result_path(args.out, name, step, tau, where)) for where, tau in protocol(args))
               for step in steps)
    weights = seed != 1 or objective not in ("sft", "relay") or store.is_complete(os.path.join(args.kept, name))
    return kept and weights


def kept_choice(args: argparse.Namespace) -> dict[str, float] | None:
    """The pilot's choice kept in --out/choice.json, or None before the pilot has finished."""
    path = os.path.join(args.out, "choice.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            chosen = json.load(f)["chosen"]
        ok = all(isinstance(chosen[o], float) and chosen[o] in args.lrs for o in ("sft", "relay"))
    except (json.JSONDecodeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise SystemExit(f"{path} does not hold a choice among --lrs={','.join(f'{lr:g}' for lr in args.lrs)} for "
                         "sft and relay: restore it (git checkout), or delete it and the pilot chooses again")
    return chosen


def base_job(args: argparse.Namespace, say) -> None:
    say("evaluating stage B")  # the table's base row: tau 0.85 only
    evaluate(args, os.path.join(args.kept, "adapt"), "base", 0, False, [("test", 0.85), ("val", 0.85)])


def run_lanes(jobs: list[tuple[str, object]], lanes: int) -> None:
    """Run the (name, callable(say)) jobs on `lanes` threads. Any error in a job, whatever its kind, stops the
    lanes from taking new jobs and ends the study non-zero with one line naming the job and the cause; what
    finished stays kept, and the same command resumes."""
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    failures: list[str] = []

    def lane(number: int) -> None:
        while not failures:
            try:
                name, job = todo.get_nowait()
            except queue.Empty:
                return
            say = lambda text: print(f"[lane {number}] {time.strftime('%H:%M')} {name}: {text}", flush=True)  # noqa: E731
            try:
                job(say)
            except BaseException as e:  # noqa: BLE001 - a lane must never die quietly
                failures.append(f"{name}: {runs.one_line(e)}")
                say(f"FAILED: {runs.one_line(e)}")
                if not isinstance(e, SystemExit):
                    traceback.print_exc()  # an unexpected error: its place in the code, above the one line

    threads = [threading.Thread(target=lane, args=(i + 1,)) for i in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit("the study stopped: " + "; ".join(failures))


# what stages C and D read: each must be the file the kept results were scored on (--out/data.json)
STUDY_FILES = ("train.jsonl", "val.jsonl", "val_rows.jsonl", "test.jsonl", "test_reworded.jsonl")


def prepare(args: argparse.Namespace) -> None:
    """The data (built, or carried with --prebuilt), stage A (v1's, kept) and stage B."""
    if args.prebuilt:
        unpack_prebuilt(args.data_dir)
    else:
        runs.sh([PY, "-m", "fastdllm.mini_data", f"--out_dir={args.corpus_dir}"])
        runs.sh([PY, "-m", "fastdllm.mini_data_v2", f"--corpus_dir={args.corpus_dir}", f"--out_dir={args.data_dir}",
                 *(SMOKE_DATA if args.smoke else [f"--n_adapt_tasks={ADAPT_TASKS}"])])
    check_data(args.data_dir, args.out)
    os.makedirs(os.path.join(args.runs, "eval"), exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.lanes))
    stage_b(args)


def pack_prebuilt(data_dir: str, dest: str, out: str) -> None:
    """What --prebuilt reads, for a machine that cannot build it (scripts/gpu/gpu_prepare.sh): each of STUDY_FILES,
    checked against --out/data.json first, gzipped into dest."""
    check_data(data_dir, out)
    os.makedirs(dest, exist_ok=True)
    for name in STUDY_FILES:
        with open(os.path.join(data_dir, name), "rb") as src, gzip.open(os.path.join(dest, name + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)


def unpack_prebuilt(data_dir: str) -> None:
    """--prebuilt: the files carried to a machine that cannot build them (a GPU loan: no corpus, 64 MiB), each as
    itself or gzipped (scripts/gpu/gpu_prepare.sh); a gzipped one is unpacked beside itself."""
    for name in STUDY_FILES:
        path = os.path.join(data_dir, name)
        if not os.path.exists(path) and os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rb") as src, open(path + ".tmp", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(path + ".tmp", path)
        if not os.path.exists(path):
            raise SystemExit(f"--prebuilt: {data_dir} holds no {name} (nor {name}.gz): carry the study's data "
                             "(bash scripts/gpu/gpu_prepare.sh)")


def check_data(data_dir: str, out: str) -> None:
    """Stages C and D read only files whose sha256 is the one in --out/data.json, kept with the results the first
    time the data is built: a generator changed since, or a damaged copy, stops the study in one line instead of
    mixing results of two data sets."""
    found = {name: common.file_sha256(os.path.join(data_dir, name)) for name in STUDY_FILES}
    kept = os.path.join(out, "data.json")
    if not os.path.exists(kept):
        os.makedirs(out, exist_ok=True)
        return runs.write_marker(kept, {"files": "what stages C and D read (scripts/table2/mini_study_v2.py)",
                                        "sha256": found})
    try:
        with open(kept) as f:
            expected = json.load(f)["sha256"]
        wrong = [name for name in STUDY_FILES if found[name] != expected.get(name)]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise SystemExit(f"{kept} does not hold the sha256 of the study's data: restore it (git checkout)") from None
    if wrong:
        raise SystemExit(f"{data_dir}: {', '.join(wrong)} differ from the data the results in {out} were scored on "
                         f"({kept}): rebuild the data as the study did, or use another --out")


def processes(args: argparse.Namespace) -> int:
    """Processes for stage B: a lane each on the CPU; one on a GPU, which needs no sharing."""
    return args.lanes if args.device == "cpu" else 1


def torch_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def stage_b(args: argparse.Namespace) -> None:
    kept = os.path.join(args.kept, "adapt")
    if store.is_complete(kept):
        store.verify_kept(kept)  # a damaged copy stops here in one line, not in every fine-tune it starts
        return print(f"stage B: {kept} is kept, skipped")
    if args.prebuilt:
        raise SystemExit(f"--prebuilt: stage B is not kept in {kept}, and its data is not carried")
    out = os.path.join(args.runs, "adapt")
    procs = processes(args)
    per_process = max(1, 4 // procs) if procs in (1, 2, 4) else 1
    extra = [f"--init_from={args.pretrain}", f"--data={args.data_dir}/adapt.jsonl",
             f"--gradient_accumulation_steps={per_process}", *args.finetune_args]
    extra = [e for e in extra if not e.startswith("--val_interval")]  # B has no validation rows
    if procs not in (1, 2, 4):
        extra.append("--effective_batch=0")
    store.finetune("config/fastdllm_mini2_adapt.py", out, extra, procs, os.path.join(args.runs, "adapt.log"))
    store.keep_log(out, "base", args.out)
    store.keep(store.last_ckpt(out), kept)


def run_all(args: argparse.Namespace) -> None:
    prepare(args)
    choice = kept_choice(args)  # once kept, only the chosen seed-1 runs whose results are not kept run again
    pilots = [(run_name(o, 1, lr), lambda say, o=o, lr=lr: pilot_job(args, o, lr, say))
              for o in ("sft", "relay") for lr in args.lrs
              if choice is None or (lr == choice[o] and not finished(args, o, 1))]
    run_lanes([("base", lambda say: base_job(args, say))] + pilots, args.lanes)
    args.choice = choice or {o: choose_rate(args.runs, o, args.lrs) for o in ("sft", "relay")}
    if choice is None:
        runs.write_marker(os.path.join(args.out, "choice.json"), {
            "rule": "per objective, the learning rate whose seed-1 run reaches the lowest validation loss",
            "chosen": args.choice, "val_loss": {run_name(o, 1, lr): val_losses(os.path.join(args.runs, run_name(o, 1, lr)))
                                                for o in ("sft", "relay") for lr in args.lrs}})
    print(f"learning rates chosen on validation: {args.choice}")
    jobs = [(run_name(o, s), lambda say, o=o, s=s: main_job(args, o, s, say)) for s in args.seeds for o in ("sft", "relay")]
    jobs += [(run_name(o, 1), lambda say, o=o: main_job(args, o, 1, say)) for o in args.extra]
    run_lanes(jobs, args.lanes)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--seeds", default="1,2,3,4,5,6", help="seeds of SFT and Relay (1 is the pilot's)")
    p.add_argument("--extra", default="", help="objectives fine-tuned once, seed 1 (rollout, relay_sg)")
    p.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in LRS), help="the pilot's learning rates")
    p.add_argument("--lanes", type=int, default=2, help="runs at once (one per core; on a GPU, several)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: every stage on the one GPU, fp32")
    p.add_argument("--corpus_dir", default="data/mini", help="the corpus and tokenizer (python -m fastdllm.mini_data)")
    p.add_argument("--data_dir", default="data/mini2")
    p.add_argument("--pretrain", default="reference/mini/pretrain", help="the kept stage A")
    p.add_argument("--runs", default="runs/mini2")
    p.add_argument("--kept", default="reference/mini2", help="the kept bf16 checkpoints: stage B, the seed-1 pair")
    p.add_argument("--out", default="results/mini_study_v2", help="kept results and the report")
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--smoke", action="store_true", help="toy sizes from the real corpus and stage A, in runs/mini2-smoke")
    p.add_argument("--prebuilt", action="store_true", help="use the data carried in --data_dir (files or .gz) instead "
                   "of building it; stage B must be kept (a GPU loan: docs/gpu.md)")
    args = p.parse_args(argv)
    args.seeds = runs.seed_list(args.seeds, "--seeds")
    runs.need(1 in args.seeds, "--seeds", "a list that holds 1 (the pilot's seed)", args.seeds)
    args.extra = [o.strip() for o in args.extra.split(",") if o.strip()]
    runs.need(all(o in OBJECTIVES[2:] for o in args.extra) and len(set(args.extra)) == len(args.extra), "--extra",
              f"each of {', '.join(OBJECTIVES[2:])} at most once", args.extra)
    try:
        args.lrs = tuple(float(t) for t in args.lrs.split(",") if t.strip())
    except ValueError:
        raise SystemExit(f"--lrs must be comma-separated numbers, got {args.lrs!r}")
    runs.need(len(args.lrs) >= 1 and all(0 < lr < 1 for lr in args.lrs), "--lrs", "rates in (0, 1)", args.lrs)
    runs.need(args.lanes >= 1, "--lanes", ">= 1", args.lanes)
    runs.need(args.device == "cpu" or (args.device == "cuda" and torch_cuda()), "--device",
              "cpu, or cuda on a GPU", args.device)
    args.taus, args.finetune_args, args.val_tasks = TAUS, [], VAL_TASKS
    if args.smoke:
        args.data_dir, args.runs, args.seeds = "data/mini2-smoke", "runs/mini2-smoke", [1, 2]
        args.kept, args.out = "runs/mini2-smoke/kept", "runs/mini2-smoke/results"
        args.taus, args.finetune_args, args.val_tasks = (0.85,), SMOKE_FINETUNE, 4
    args.finetune_args = [*args.finetune_args, f"--device={args.device}"]
    for key in ("corpus_dir", "data_dir", "runs", "kept", "out"):
        runs.check_folder(getattr(args, key), f"--{key}")
        setattr(args, key, os.path.relpath(os.path.abspath(getattr(args, key)), runs.ROOT))
    args.pretrain = os.path.relpath(os.path.abspath(args.pretrain), runs.ROOT)
    if not args.report_only and not store.is_complete(os.path.join(runs.ROOT, args.pretrain)):
        raise SystemExit(f"--pretrain={args.pretrain} holds no kept stage A: restore reference/mini/pretrain (git checkout), "
                         "or pretrain it again (docs/table2_miniature.md: scripts/table2/pretrain_ar.py)")
    mini_report_v2.kept(os.path.join(runs.ROOT, args.out))  # every kept result checked now, not after hours of work
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(runs.ROOT)
    if not args.report_only:
        lock = common.acquire_lock(args.runs)  # a second study on these folders stops here, in one line
        try:
            run_all(args)
        finally:
            common.release_lock(lock)
    mini_report_v2.main([args.out])


if __name__ == "__main__":
    main()
