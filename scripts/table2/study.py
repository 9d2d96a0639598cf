"""Table 2 in miniature: its studies, one driver (docs/table2_v2_protocol.md, docs/table2_v3_protocol.md).

    python scripts/table2/study.py --study=v2             # v2: SFT and Relay at the rate each chose on validation
    python scripts/table2/study.py --study=v3             # P, the paper's regime: data, B3, the fine-tunes, decodings
    python scripts/table2/study.py --study=v3t            # T, why v2 came out the other way (v2's base and data)
    python scripts/table2/study.py --study=v3,v3t         # both in one queue on two lanes, P's jobs first
    python scripts/table2/study.py --study=v3 --smoke     # toy sizes: the whole pipeline in minutes (runs/mini3-smoke)
    python scripts/table2/study.py --study=v3 --device=cuda --lanes=8 --prebuilt --data_dir=data/mini3-gpu  # docs/gpu.md

Each job is skipped when its results are kept in the study's --out, so a killed study resumes with the same command;
an interrupted training run resumes from its last checkpoint. A lane takes the first job whose inputs exist (v2's
seeds wait for its rate pilot, P's fine-tunes for B3, and all but seed 1's pair for the regime check). Every decoding
is one JSON per (model, step, protocol, tau), stamped with the study, the data file's sha256, the model's manifest
digest, a digest of its task ids and of its whole content (scripts/table2/store.py: stamp). The reports are drawn
by scripts/table2/mini_report_v2.py.
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import common  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.table2 import mini_report_v2, store  # noqa: E402

PY = sys.executable
CARRY = store.CARRY
EVAL_ARGS = ["--dataset=humaneval", "--block_size=32", "--sub_block_size=8", "--max_new_tokens=224", "--batch_size=32",
             "--dtype=float32", "--decode=authors"]
FILES = {"test": "test.jsonl", "reworded": "test_reworded.jsonl", "val": "val.jsonl"}
VAL = ("val", 0.85)


@dataclass
class Study:
    """Where a study reads and writes, and its sizes (smoke: toy ones)."""
    name: str
    data_dir: str
    pins: str  # the data.json of sha256 every file read must match
    pinned: tuple[str, ...]
    runs: str
    out: str
    kept: str = ""  # bf16 copies of the models later runs start from (v2: stage B, the seed-1 pair; v3: B3)
    taus: tuple[float, ...] = (0.7, 0.85, 0.95)
    val_tasks: int = 200
    b3_every: int = 100  # B3: steps between validation decodings
    b3_cap: int = 2000
    b3_stage: int = 200  # B3 trains in stages of this many steps (b3_checkpoint)
    b3_rows: int = 32  # rows per B3 step (config/fastdllm_mini3_b3.py; smoke: SMOKE_FINETUNE's 2 x 2)
    capable: float = 20.0  # regime check (a): B3's validation pass@1 plus, in points (smoke: 0, so the fine-tunes run)
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5, 6)  # v2: seeds of SFT and Relay (1 is the pilot's)
    extra: tuple[str, ...] = ()  # v2: objectives fine-tuned once, seed 1, at Relay's rate
    lrs: tuple[float, ...] = (3e-4, 1e-3)  # v2: the pilot's learning rates
    prebuilt: bool = False  # the data carried in data_dir (files or .gz), the base kept (a GPU loan)
    sandbox: str = "auto"  # eval_code.py --sandbox: where the judged programs run (recorded in every decoding)
    finetune_args: list[str] = field(default_factory=list)
    device: str = "cpu"
    lanes: int = 2

    def protocol(self) -> list[tuple[str, float]]:
        """A fine-tune's decodings: test tasks at each tau, held-out wording and validation at tau 0.85."""
        return [("test", tau) for tau in self.taus] + [("reworded", 0.85), VAL]


V2_FILES = ("train.jsonl", "val.jsonl", "val_rows.jsonl", "test.jsonl", "test_reworded.jsonl")  # what v2's runs read
P_FILES = ("adapt.jsonl", *V2_FILES)
# v2's stage B mixture holds this many task rows of training compositions (none of the validation or test programs):
# the pre-registered band check failed without them (docs/table2_v2_protocol.md, "Added after the first pilot")
ADAPT_TASKS = {"v2": 8000, "v3t": 8000, "v3": 30000}
SMOKE_DATA = ["--n_train=300", "--n_val=8", "--n_val_rows=4", "--n_test=8"]
SMOKE_ADAPT = {"v2": 30, "v3t": 60, "v3": 60}
V2_SMOKE_FINETUNE = ["--max_iters=4", "--save_interval=2", "--val_interval=2", "--warmup_iters=1", "--lr_decay_iters=4",
                     "--device_batch_size=2", "--effective_batch=0"]
SMOKE_FINETUNE = ["--max_iters=4", "--save_interval=2", "--val_interval=2", "--device_batch_size=2",
                  "--gradient_accumulation_steps=2", "--effective_batch=0", "--warmup_iters=1"]
PRETRAIN = "reference/mini/pretrain"  # stage A, shared with v1 (scripts/table2/pretrain_ar.py)
V2_SMOKE_KEPT = "runs/mini2-smoke/kept"  # the v2 smoke's stage B, which the v3 smokes start from


def study(name: str, smoke: bool) -> Study:
    if name == "v2":
        s = Study("v2", "data/mini2", "results/mini_study_v2/data.json", V2_FILES, "runs/mini2", "results/mini_study_v2",
                  "reference/mini2")
    elif name == "v3":
        s = Study("v3", "data/mini3", "results/mini_study_v3/data.json", P_FILES, "runs/mini3/p", "results/mini_study_v3",
                  "reference/mini3")
    else:  # T reads v2's data, pinned by v2's own data.json
        s = Study("v3t", "data/mini2", "results/mini_study_v2/data.json", V2_FILES, "runs/mini3/t",
                  "results/mini_study_v3_t", "reference/mini2")
    if smoke and name == "v2":
        s.data_dir, s.runs, s.kept, s.out = "data/mini2-smoke", "runs/mini2-smoke", V2_SMOKE_KEPT, "runs/mini2-smoke/results"
        s.seeds, s.taus, s.val_tasks, s.finetune_args = (1, 2), (0.85,), 4, V2_SMOKE_FINETUNE
    elif smoke:
        s.data_dir, s.runs, s.out = f"data/mini3-smoke-{name}", f"runs/mini3-smoke/{name}", f"runs/mini3-smoke/{name}/results"
        s.kept = "runs/mini3-smoke/kept-smoke" if name == "v3" else V2_SMOKE_KEPT
        s.taus, s.val_tasks, s.b3_every, s.b3_cap, s.finetune_args = (0.85,), 4, 2, 8, SMOKE_FINETUNE
        s.b3_stage, s.b3_rows = 4, 4
        s.capable = 0.0
    if smoke:
        s.pins = os.path.join(s.out, "data.json")
    return s


def kept_b3(st: Study) -> str:
    return os.path.join(st.kept, "b3")


# -----------------------------------------------------------------------------
# data


def prepare(st: Study, smoke: bool) -> None:
    """Build the data unless it is there (v2's build for T) or carried (--prebuilt), check every file against the
    study's pins; v2: its stage B (v3 starts from v2's kept one)."""
    if st.prebuilt:
        if st.name == "v3" and not b3_done(st):
            raise SystemExit(f"--prebuilt: B3 is not kept in {kept_b3(st)} with its trace in {st.out}/b3.json, and "
                             "its mixture is not carried")
        unpack_prebuilt(st)
    elif not os.path.exists(os.path.join(st.data_dir, "build.json")):
        runs.sh([PY, "-m", "fastdllm.mini_data", "--out_dir=data/mini"])
        size = [*(SMOKE_DATA if smoke else []), f"--n_adapt_tasks={(SMOKE_ADAPT if smoke else ADAPT_TASKS)[st.name]}"]
        runs.sh([PY, "-m", "fastdllm.mini_data_v2", "--corpus_dir=data/mini", f"--out_dir={st.data_dir}", *size])
    check_pins(st)
    if st.name == "v2":
        stage_b(st)


def pack_prebuilt(st: Study, dest: str) -> None:
    """What --prebuilt reads, for a machine that cannot build it (scripts/gpu/gpu_prepare.sh): each pinned file,
    checked against the pins first, gzipped into dest."""
    check_pins(st)
    os.makedirs(dest, exist_ok=True)
    for name in carried(st):
        with open(os.path.join(st.data_dir, name), "rb") as src, gzip.open(os.path.join(dest, name + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)


def carried(st: Study) -> tuple[str, ...]:
    """The pinned files a loan needs: all but B3's mixture, which no fine-tune reads (B3 is kept before one)."""
    return tuple(name for name in st.pinned if name != "adapt.jsonl")


def unpack_prebuilt(st: Study) -> None:
    """--prebuilt: the files carried to a machine that cannot build them (a GPU loan: no corpus, 64 MiB), each as
    itself or gzipped (scripts/gpu/gpu_prepare.sh); a gzipped one is unpacked beside itself."""
    for name in carried(st):
        path = os.path.join(st.data_dir, name)
        if not os.path.exists(path) and os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rb") as src, open(path + ".tmp", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(path + ".tmp", path)
        if not os.path.exists(path):
            raise SystemExit(f"--prebuilt: {st.data_dir} holds no {name} (nor {name}.gz): carry the study's data "
                             "(bash scripts/gpu/gpu_prepare.sh)")


def check_pins(st: Study) -> None:
    """Each file the study reads has the sha256 kept in st.pins, written the first time (not for T, which reads v2's
    data as v2 pinned it): a generator changed since, or a damaged copy, stops the study in one line instead of
    mixing results of two data sets."""
    names = carried(st) if st.prebuilt else st.pinned
    found = {name: common.file_sha256(os.path.join(st.data_dir, name)) for name in names}
    if not os.path.exists(st.pins):
        if st.name == "v3t" and "smoke" not in st.runs:
            raise SystemExit(f"{st.pins} is missing: T reads v2's data as v2 pinned it (git checkout {st.pins})")
        os.makedirs(os.path.dirname(st.pins), exist_ok=True)
        return runs.write_marker(st.pins, {"files": f"what scripts/table2/study.py --study={st.name} reads",
                                           "sha256": found})
    try:
        with open(st.pins) as f:
            expected = json.load(f)["sha256"]
        wrong = [name for name in names if found[name] != expected[name]]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise SystemExit(f"{st.pins} does not hold the sha256 of every file in {st.data_dir}: restore it (git checkout)") \
            from None
    if wrong:
        raise SystemExit(f"{st.data_dir}: {', '.join(wrong)} differ from the data pinned in {st.pins}: rebuild the data "
                         "as the study did, or restore the pins")


# -----------------------------------------------------------------------------
# training and decoding


def train(st: Study, config: str, name: str, args: list[str], say, max_iters: int | None = None) -> str:
    """train_fastdllm.py on one core, resumed from the run's last save; max_iters: train (on) to that step."""
    out = os.path.join(st.runs, name)
    extra = [*st.finetune_args, *args, f"--device={st.device}"]  # the job's own settings over the smoke's sizes
    wait_for(out, say)
    if max_iters is not None:
        extra = [a for a in extra if not a.startswith("--max_iters")] + [f"--max_iters={max_iters}"]
        if store.is_complete(os.path.join(out, f"ckpt-{max_iters}")):
            return out
        say(f"training to step {max_iters} (log: {out}.log)")
        runs.sh([PY, "train_fastdllm.py", config, f"--out_dir={out}", *extra, *store.resume_flags(out)], log=out + ".log",
                echo=False)
        return out
    say(f"training (log: {out}.log)")
    store.finetune(config, out, extra, 1, out + ".log", echo=False)
    return out


def wait_for(run_dir: str, say) -> None:
    """A run another process holds (one started by hand with the study's command) is waited for, then resumed."""
    holder = common.lock_holder(run_dir)
    if holder is not None:
        say(f"{run_dir} is held by {holder}: waiting for it to finish")
    while common.lock_holder(run_dir) is not None:
        time.sleep(30)


def model_digest(model_dir: str) -> str:
    """sha256 of the checkpoint's manifest.json (which holds the sha256 of every file of the model)."""
    return common.file_sha256(os.path.join(model_dir, common.MANIFEST))


def decode(st: Study, model_dir: str, name: str, step: int, carry: bool, jobs: list[tuple[str, float]]) -> list[dict]:
    """eval_code.py for each (protocol, tau) not kept yet; each result kept as one stamped JSON."""
    kept = []
    for protocol, tau in jobs:
        path = store.result_path(st.out, name, step, tau, protocol)
        forget_other_model(path, model_dir)
        if not os.path.exists(path):
            out = os.path.join(st.runs, "eval", name, f"step_{step}", f"{protocol}_tau_{tau:g}")
            data = os.path.join(st.data_dir, FILES[protocol])
            limit = [f"--limit={st.val_tasks}"] if protocol == "val" else []
            os.makedirs(os.path.join(st.runs, "eval"), exist_ok=True)
            runs.sh([PY, "eval_code.py", f"--model={model_dir}", f"--data_path={data}", *limit, f"--threshold={tau}",
                     f"--relay_carry={carry}", f"--out_dir={out}", f"--gt_cache_dir={st.runs}/gt_cache", *EVAL_ARGS,
                     f"--device={st.device}", f"--workers={judge_workers(st)}", f"--sandbox={st.sandbox}"],
                    log=os.path.join(st.runs, "eval", f"{name}.log"), echo=False)
            store.compact(out, path, dict(
                study=st.name, model=name, step=step, tau=tau, protocol=protocol, relay_carry=carry, device=st.device,
                data_file=FILES[protocol], data_sha256=common.file_sha256(data), model_digest=model_digest(model_dir),
                digest=None))
        kept.append(store.read_kept(path))
    return kept


def judge_workers(st: Study) -> int:
    """Processes that run the tests of one decoding: on the CPU one per lane (a lane owns a core and decodes or
    judges); on a GPU the decoding is not on the cores, so the lanes share them all for the judging."""
    return 1 if st.device == "cpu" else max(1, (os.cpu_count() or 1) // st.lanes)


def forget_other_model(path: str, model_dir: str) -> None:
    """A kept decoding of another model under this name (a run trained again on another machine, whose run folder
    was not carried) is moved aside, so that every result follows the run that goes on. v2's decodings, made before
    results named their model's digest, hold none: they stay."""
    recorded = store.read_kept(path).get("model_digest") if os.path.exists(path) else None
    if recorded is not None and recorded != model_digest(model_dir):
        move_aside(path, "decoded another run's checkpoint")


def forget_unreached(st: Study, name: str, reached: set[int]) -> None:
    """Kept decodings of a run at steps it has not reached (no checkpoint of them in its folder, or a kept stage
    of them; step 0 is the model it starts from) came from an earlier run of it, whose folder was lost: moved aside
    before the run goes on, so that no reader mixes two runs while this one catches up."""
    folder, reached = os.path.join(st.out, name), {0, *reached}
    for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        step = file.split("_")[1] if file.startswith("step_") else ""
        if step.isdigit() and int(step) not in reached:
            move_aside(os.path.join(folder, file), "decoded a checkpoint this run has not reached")


def move_aside(path: str, why: str) -> None:
    """Into other_runs/<n>/, n the first earlier run with no decoding of that name: each lost run's record is kept
    whole, in the order the runs were made (a second lost run must not overwrite the first's)."""
    n = 1
    while os.path.exists(os.path.join(aside := os.path.join(os.path.dirname(path), "other_runs", str(n)),
                                      os.path.basename(path))):
        n += 1
    os.makedirs(aside, exist_ok=True)
    os.replace(path, os.path.join(aside, os.path.basename(path)))
    print(f"{path} {why} (moved to {aside}/): decoding it again", flush=True)


def plus(record: dict) -> float:
    return 100 * sum(record["plus"]) / len(record["plus"])


# -----------------------------------------------------------------------------
# v2: stage B, a rate pilot, SFT and Relay at the rate each chose on validation (docs/table2_v2_protocol.md)


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


def kept_choice(st: Study) -> dict[str, float] | None:
    """The pilot's choice kept in --out/choice.json, or None before the pilot has finished."""
    path = os.path.join(st.out, "choice.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            chosen = json.load(f)["chosen"]
        ok = all(isinstance(chosen[o], float) and chosen[o] in st.lrs for o in ("sft", "relay"))
    except (json.JSONDecodeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise SystemExit(f"{path} does not hold a choice among --lrs={','.join(f'{lr:g}' for lr in st.lrs)} for "
                         "sft and relay: restore it (git checkout), or delete it and the pilot chooses again")
    return chosen


def stage_b(st: Study) -> None:
    """Stage B (adaptation on docstring pairs and task rows), one process per lane on the CPU, kept in bf16."""
    kept = os.path.join(st.kept, "adapt")
    if store.is_complete(kept):
        store.verify_kept(kept)  # a damaged copy stops here in one line, not in every fine-tune it starts
        return print(f"stage B: {kept} is kept, skipped")
    if st.prebuilt:
        raise SystemExit(f"--prebuilt: stage B is not kept in {kept}, and its data is not carried")
    out = os.path.join(st.runs, "adapt")
    procs = st.lanes if st.device == "cpu" else 1
    per_process = max(1, 4 // procs) if procs in (1, 2, 4) else 1
    extra = [f"--init_from={PRETRAIN}", f"--data={st.data_dir}/adapt.jsonl", f"--gradient_accumulation_steps={per_process}",
             *[a for a in st.finetune_args if not a.startswith("--val_interval")], f"--device={st.device}"]  # no validation rows
    if procs not in (1, 2, 4):
        extra.append("--effective_batch=0")
    store.finetune("config/fastdllm_mini2_adapt.py", out, extra, procs, os.path.join(st.runs, "adapt.log"))
    store.keep_log(out, "base", st.out)
    store.keep(store.last_ckpt(out), kept)


def v2_jobs(st: Study) -> list["Job"]:
    """Stage B's decoding; the pilot (seed 1 of SFT and Relay at each rate; once its choice is kept, only a chosen
    run whose results are not); then, once the rates are chosen, the seeds and the extra objectives."""
    chosen = kept_choice(st)
    pilots = {run_name(o, 1, lr): (o, lr) for o in ("sft", "relay") for lr in st.lrs
              if chosen is None or (lr == chosen[o] and not v2_finished(st, o, 1))}
    left = set(pilots)

    def pilot(say, name):
        train(st, f"config/fastdllm_mini2_{pilots[name][0]}.py", name, v2_args(st, 1, pilots[name][1]), say)
        left.discard(name)

    def rates_chosen() -> bool:
        """Every pilot run of this queue trained (a seed-1 run is its pilot's), and the choice made and kept."""
        if left:
            return False
        if not hasattr(st, "choice"):
            st.choice = {o: choose_rate(st.runs, o, st.lrs) for o in ("sft", "relay")}
            runs.write_marker(os.path.join(st.out, "choice.json"), {
                "rule": "per objective, the learning rate whose seed-1 run reaches the lowest validation loss",
                "chosen": st.choice, "val_loss": {n: val_losses(os.path.join(st.runs, n)) for n in pilots}})
            print(f"learning rates chosen on validation: {st.choice}", flush=True)
        return True

    if chosen is not None:
        st.choice = chosen
    adapt = os.path.join(st.kept, "adapt")
    jobs = [Job("v2 base", lambda say: decode(st, adapt, "base", 0, False, [("test", 0.85), VAL]),
                done=lambda: all(os.path.exists(store.result_path(st.out, "base", 0, 0.85, w)) for w in ("test", "val")))]
    jobs += [Job(f"v2 {name}", lambda say, n=name: pilot(say, n)) for name in pilots]
    # the study proper: the seeds of SFT and Relay, then the extra objectives at seed 1
    proper = [(o, s) for s in st.seeds for o in ("sft", "relay")] + [(o, 1) for o in st.extra]
    jobs += [Job(f"v2 {run_name(o, s)}", lambda say, o=o, s=s: v2_run(st, o, s, say), rates_chosen,
                 done=lambda o=o, s=s: v2_finished(st, o, s)) for o, s in proper]
    return jobs


def v2_run(st: Study, objective: str, seed: int, say) -> None:
    """A run of the study proper at its chosen rate (seed 1: the pilot's run, not trained again), decoded at its
    checkpoint of lowest validation loss with st.protocol(); the seed-1 pair's weights kept."""
    lr = st.choice["relay" if objective not in st.choice else objective]
    name = run_name(objective, seed)
    if seed == 1 and objective in st.choice:
        run = os.path.join(st.runs, run_name(objective, 1, lr))
    else:
        run = train(st, f"config/fastdllm_mini2_{objective}.py", name, v2_args(st, seed, lr), say)
    store.keep_log(run, name, st.out)
    step = chosen_step(run)
    say(f"trained; validation chose step {step}; decoding")
    ckpt = os.path.join(run, f"ckpt-{step}")
    decode(st, ckpt, name, step, CARRY[objective], st.protocol())
    if seed == 1 and objective in ("sft", "relay"):
        store.keep(ckpt, os.path.join(st.kept, name))
    say(f"decoded; results in {st.out}/{name}")


def v2_finished(st: Study, objective: str, seed: int) -> bool:
    """Every result of the run's protocol kept (and, for the seed-1 pair, its weights): what the repository keeps,
    so that a study resumed on another machine does not train it again."""
    weights = seed != 1 or objective not in ("sft", "relay") or store.is_complete(os.path.join(st.kept, f"{objective}_s1"))
    return finished(st, run_name(objective, seed)) and weights


def finished(st: Study, name: str) -> bool:
    """Every decoding of the study's protocol is kept at one of the run's steps."""
    return kept_at_one_step(st, name, st.protocol())


def kept_at_one_step(st: Study, name: str, wanted: list[tuple[str, float]]) -> bool:
    """Each (protocol, tau) decoding in wanted is kept in st.out at one and the same step of the run."""
    folder = os.path.join(st.out, name)
    steps = {int(f.split("_")[1]) for f in os.listdir(folder) if f.startswith("step_")} if os.path.isdir(folder) else set()
    return any(all(os.path.exists(store.result_path(st.out, name, step, tau, where)) for where, tau in wanted)
               for step in steps)


# -----------------------------------------------------------------------------
# P: B3, the regime check, the fine-tunes


def plateau(p: dict[int, float], every: int, cap: int) -> int | None:
    """The protocol's stopping step: the first s >= 3 * every where the best of the last three evaluations is less
    than 2 points above the best of every earlier one (step 0, stage B, included); cap at the latest."""
    for s in sorted(p):
        if s >= 3 * every and all(t in p for t in (s - 2 * every, s - every)):
            earlier = [v for t, v in p.items() if t < s - 2 * every]
            if max(p[s - 2 * every], p[s - every], p[s]) < max(earlier) + 2:
                return s
        if s >= cap:
            return s
    return None


def b3_job(st: Study, say) -> None:
    """B3 trained and kept (train_b3), then the kept B3 decoded on validation and test as the base row; regime
    check (a) is read at once."""
    if not b3_done(st):
        train_b3(st, say)
    if last_stage(st):  # B3 is kept: no stage starts from its stage copy again
        shutil.rmtree(b3_stage_copy(st, last_stage(st)))
    with open(os.path.join(st.out, "b3.json")) as f:
        stop = json.load(f)["stop"]
    say(f"decoding the kept B3 (step {stop})")
    decode(st, kept_b3(st), "base", stop, False, [VAL, ("test", 0.85)])
    if (check := regime(st))["passed"] is False:  # (a) failed: no fine-tune starts from this B3
        runs.write_marker(os.path.join(st.out, "regime.json"), check)


def train_b3(st: Study, say) -> None:
    """Train B3 every steps at a time in stages (b3_checkpoint), decode each checkpoint on validation, stop by the
    plateau rule; keep its trace in --out/b3.json and the checkpoint it stops at (bf16). A stage's end is kept in
    bf16 (b3_stage_copy) when B3 goes on past it: what the next stage starts from, on this machine or another;
    each stage's log is kept in --out/b3/stage_<start>/."""
    base = os.path.join(V2_SMOKE_KEPT if "smoke" in st.runs else "reference/mini2", "adapt")
    done = last_stage(st)
    forget_unreached(st, "b3", set(range(done + 1)) | {done + s for s in store.kept_steps(stage_run(st, done))})
    p = {0: plus(decode(st, base, "b3", 0, False, [VAL])[0])}
    while (stop := plateau(p, st.b3_every, st.b3_cap)) is None:
        s = max(p) + st.b3_every
        if s <= done:  # a kept stage's decoding: its run folder may have gone with its machine
            p[s] = plus(store.read_kept(store.result_path(st.out, "b3", s, 0.85, "val")))
            continue
        ckpt = b3_checkpoint(st, s, base, say)
        p[s] = plus(decode(st, ckpt, "b3", s, False, [VAL])[0])
        say(f"step {s}: validation pass@1 plus {p[s]:.1f}%")
        if s % st.b3_stage == 0 and plateau(p, st.b3_every, st.b3_cap) is None:
            store.keep(ckpt, b3_stage_copy(st, s), step=s)
            if s > st.b3_stage:  # only the last stage is started from again: the repository keeps one copy (5 MB)
                shutil.rmtree(b3_stage_copy(st, s - st.b3_stage), ignore_errors=True)
            store.keep_log(os.path.dirname(ckpt), f"b3/stage_{s - st.b3_stage}", st.out)
    ckpt = b3_checkpoint(st, stop, base, say)
    store.keep_log(os.path.dirname(ckpt), f"b3/stage_{(stop - 1) // st.b3_stage * st.b3_stage}", st.out)
    runs.write_marker(os.path.join(st.out, "b3.json"), {
        "rule": "stop at the first s >= 3 x every where the best of p(s - 2 every), p(s - every), p(s) is < 2 points "
                "above the best earlier p; p = validation pass@1 plus at tau 0.85 (docs/table2_v3_protocol.md)",
        "every": st.b3_every, "cap": st.b3_cap, "stage": st.b3_stage,
        "val_plus": {str(k): v for k, v in sorted(p.items())}, "stop": stop})
    store.keep(ckpt, kept_b3(st), step=stop)
    say(f"B3 stops at step {stop} ({p[stop]:.1f}% validation plus)")


def b3_checkpoint(st: Study, s: int, base: str, say) -> str:
    """B3's checkpoint at step s, its stage trained as far as s needs. Stage k holds steps (k - 1) n + 1 ... k n
    (n = st.b3_stage, one session of these machines): the first starts from base, each later one from the kept
    bf16 copy of the stage before with a fresh optimizer and warm-up, and reads on in the mixture's row order."""
    start = (s - 1) // st.b3_stage * st.b3_stage
    args = [f"--data={st.data_dir}/adapt.jsonl", f"--val_data={st.data_dir}/val_rows.jsonl", "--save_interval=25",
            f"--init_from={b3_stage_copy(st, start) if start else base}"]
    if start:
        args.append(f"--data_start={start * st.b3_rows}")
    run = train(st, "config/fastdllm_mini3_b3.py", os.path.basename(stage_run(st, start)), args, say,
                max_iters=s - start)
    return os.path.join(run, f"ckpt-{s - start}")


def stage_run(st: Study, start: int) -> str:
    return os.path.join(st.runs, "b3" if start == 0 else f"b3_from_{start}")


def b3_stage_copy(st: Study, end: int) -> str:
    return f"{kept_b3(st)}_stage_{end}"


def last_stage(st: Study) -> int:
    """The last step of B3 whose stage is kept (0: none yet)."""
    ends = [path.rsplit("_", 1)[1] for path in glob.glob(f"{kept_b3(st)}_stage_*")]
    return max([int(end) for end in ends if end.isdigit() and store.is_complete(b3_stage_copy(st, int(end)))], default=0)


def b3_done(st: Study) -> bool:
    return store.is_complete(kept_b3(st)) and os.path.exists(os.path.join(st.out, "b3.json"))


def base_decoded(st: Study) -> str:
    """The path of the kept B3's test decoding, the last thing b3_job writes."""
    with open(os.path.join(st.out, "b3.json")) as f:
        return store.result_path(st.out, "base", json.load(f)["stop"], 0.85, "test")


def regime(st: Study) -> dict | None:
    """The regime check, None until the kept B3's validation decoding is kept: (a) B3 >= 20% validation pass@1 plus,
    read at once (a base that fails it is replaced before any fine-tune starts from it); (b) SFT seed 1 within 5
    points of B3, once decoded ("passed" is None until then)."""
    with open(os.path.join(st.out, "b3.json")) as f:
        stop = json.load(f)["stop"]
    base = store.result_path(st.out, "base", stop, 0.85, "val")
    sft = store.result_path(st.out, "sft_s1", 200 if "smoke" not in st.runs else 4, 0.85, "val")
    if not os.path.exists(base):
        return None
    check = {"b3_val_plus": plus(store.read_kept(base)), "b3_needs": st.capable, "sft_s1_val_plus": None, "passed": None}
    if check["b3_val_plus"] < st.capable:
        check["passed"] = False
    elif os.path.exists(sft):
        check["sft_s1_val_plus"] = plus(store.read_kept(sft))
        check["passed"] = abs(check["sft_s1_val_plus"] - check["b3_val_plus"]) <= 5
    return check


def regime_passed(st: Study, first_pair: bool = False) -> bool:
    """Whether the regime check has passed (first_pair: whether (a) has); a failed check stops every P fine-tune
    that waits for it, in one line."""
    check = regime(st) if b3_done(st) else None
    if check is not None and check["passed"] is False:
        sft = "not run" if check["sft_s1_val_plus"] is None else f"{check['sft_s1_val_plus']:.1f}%"
        raise SystemExit(f"the regime check failed (B3 {check['b3_val_plus']:.1f}%, SFT s1 {sft} validation plus; the "
                         f"rule: B3 >= {st.capable:g}, SFT within 5 points): the base changes, never the methods "
                         "(docs/table2_v3_protocol.md)")
    return check is not None if first_pair else bool(check and check["passed"])


def finetune_job(st: Study, objective: str, seed: int, say) -> None:
    """A P fine-tune from the kept B3, decoded at checkpoint 200 with st.protocol()."""
    name = f"{objective}_s{seed}"
    run = train(st, f"config/fastdllm_mini3_{objective}.py", name, [
        f"--seed={seed}", f"--init_from={kept_b3(st)}", f"--data={st.data_dir}/train.jsonl",
        f"--val_data={st.data_dir}/val_rows.jsonl"], say)
    store.keep_log(run, name, st.out)
    step = store.kept_steps(run)[-1]
    say(f"trained; decoding checkpoint {step}")
    decode(st, os.path.join(run, f"ckpt-{step}"), name, step, CARRY[objective], st.protocol())
    if name == "sft_s1":
        runs.write_marker(os.path.join(st.out, "regime.json"), regime(st))
    say("decoded")


def p_jobs(st: Study) -> list["Job"]:
    """B3, seed 1's pair (the regime check reads SFT s1), seeds 2-6 of SFT and Relay, seeds 1-3 of the other two."""
    first = [(o, 1) for o in ("sft", "relay")]
    later = [(o, s) for s in range(2, 7) for o in ("sft", "relay")] + [(o, s) for s in (1, 2, 3) for o in ("rollout", "relay_sg")]
    if "smoke" in st.runs:
        later = [("sft", 2), ("relay", 2)]
    jobs = [Job("v3 b3", lambda say: b3_job(st, say), done=lambda: b3_done(st) and os.path.exists(base_decoded(st)))]
    for (o, s) in first + later:
        ready = (lambda: regime_passed(st, first_pair=True)) if (o, s) in first else (lambda: regime_passed(st))
        jobs.append(Job(f"v3 {o}_s{s}", lambda say, o=o, s=s: finetune_job(st, o, s, say), ready,
                        done=lambda o=o, s=s: finished(st, f"{o}_s{s}")))
    return jobs


# -----------------------------------------------------------------------------
# T: rate, data seen and training length on v2's base


V2_RATE = {"sft": 0.001, "relay": 0.0003}


def v2_args(st: Study, seed: int, lr: float) -> list[str]:
    """A fine-tune from v2's stage B on v2's data (T's runs log every step)."""
    return [f"--seed={seed}", f"--learning_rate={lr}", f"--init_from={os.path.join(st.kept, 'adapt')}",
            f"--data={st.data_dir}/train.jsonl", f"--val_data={st.data_dir}/val_rows.jsonl",
            *(["--log_interval=1"] if st.name == "v3t" else [])]


def trajectory_job(st: Study, name: str, objective: str, lr: float, extra: list[str], say) -> None:
    """Train, then decode every checkpoint on validation and the last on the test tasks at tau 0.85."""
    run = train(st, f"config/fastdllm_mini2_{objective}.py", name, v2_args(st, 1, lr) + extra, say)
    store.keep_log(run, name, st.out)
    steps = store.kept_steps(run)
    for step in steps:
        say(f"decoding checkpoint {step} on validation")
        decode(st, os.path.join(run, f"ckpt-{step}"), name, step, CARRY[objective], [VAL])
    decode(st, os.path.join(run, f"ckpt-{steps[-1]}"), name, steps[-1], CARRY[objective], [("test", 0.85)])


def variant_job(st: Study, name: str, objective: str, seed: int, lr: float, extra, say) -> None:
    """Train, then decode the checkpoint of lowest validation loss (v2's rule) on test and validation at tau 0.85."""
    run = train(st, f"config/fastdllm_mini2_{objective}.py", name, v2_args(st, seed, lr) + extra(), say)
    store.keep_log(run, name, st.out)
    step = chosen_step(run)
    say(f"trained; validation chose step {step}; decoding")
    decode(st, os.path.join(run, f"ckpt-{step}"), name, step, CARRY[objective], [("test", 0.85), VAL])


def relay_rows(st: Study) -> int:
    """The distinct rows T's Relay seed 1 took by its last step, from its kept log."""
    rows = store.read_metrics(os.path.join(st.out, "relay_s1", "train_metrics.jsonl"))
    if "distinct_rows" not in rows[-1]:
        raise SystemExit(f"{st.out}/relay_s1/train_metrics.jsonl: distinct_rows: not logged (train_fastdllm.py logs it)")
    return rows[-1]["distinct_rows"]


def t_jobs(st: Study) -> list["Job"]:
    steps = 300 if "smoke" not in st.runs else 4
    long = ["--max_iters=900", "--lr_decay_iters=900", "--save_interval=150"] if "smoke" not in st.runs else \
        ["--max_iters=6", "--lr_decay_iters=6", "--save_interval=2"]
    relay_logged = lambda: os.path.exists(os.path.join(st.out, "relay_s1", "train_metrics.jsonl")) and \
        store.read_jsonl(os.path.join(st.out, "relay_s1", "train_metrics.jsonl"))[-1]["step"] >= steps  # noqa: E731
    jobs = [Job("v3t relay_s1", lambda say: trajectory_job(st, "relay_s1", "relay", V2_RATE["relay"], [], say),
                done=lambda: t_finished(st, "relay_s1")),
            Job("v3t sft_s1", lambda say: trajectory_job(st, "sft_s1", "sft", V2_RATE["sft"], [], say),
                done=lambda: t_finished(st, "sft_s1"))]
    for seed in (1, 2, 3) if "smoke" not in st.runs else (1,):
        jobs.append(Job(f"v3t relay_lr0.001_s{seed}", lambda say, s=seed: variant_job(
            st, f"relay_lr0.001_s{s}", "relay", s, 0.001, lambda: [], say), done=lambda s=seed: t_finished(st, f"relay_lr0.001_s{s}")))
        jobs.append(Job(f"v3t sft_limited_s{seed}", lambda say, s=seed: variant_job(
            st, f"sft_limited_s{s}", "sft", s, V2_RATE["sft"], lambda: [f"--data_rows={relay_rows(st)}"], say),
            relay_logged, done=lambda s=seed: t_finished(st, f"sft_limited_s{s}")))
    jobs.append(Job("v3t relay_steps900_s1", lambda say: trajectory_job(
        st, "relay_steps900_s1", "relay", V2_RATE["relay"], long, say), done=lambda: t_finished(st, "relay_steps900_s1")))
    return jobs


def t_finished(st: Study, name: str) -> bool:
    """The run's test and validation decodings at tau 0.85 are both kept at one step (a trajectory job
    decodes validation at every checkpoint and the test last; a variant job both at its chosen step)."""
    return kept_at_one_step(st, name, [("test", 0.85), ("val", 0.85)])


# -----------------------------------------------------------------------------
# lanes


@dataclass
class Job:
    name: str
    work: object  # callable(say)
    ready: object = lambda: True  # noqa: E731 - whether its inputs exist (raises SystemExit: they never will)
    done: object = lambda: False  # noqa: E731 - whether its results are all kept already


def run_lanes(jobs: list[Job], lanes: int) -> None:
    """Each lane takes the first job whose inputs exist, in the order given; a job none can start waits. Any error
    stops the lanes from taking new jobs and ends the study non-zero with one line naming the job and the cause;
    what finished stays kept, and the same command resumes."""
    todo = [j for j in jobs if not j.done()]
    for j in jobs:
        if j not in todo:
            print(f"{j.name}: every result is kept; skipped", flush=True)
    lock, failures, refused, busy = threading.Lock(), [], [], [0]

    def first_ready() -> Job | None:
        """The first job whose inputs exist; a job whose inputs never will (its ready() stops) is dropped."""
        for j in list(todo):
            try:
                if j.ready():
                    return j
            except SystemExit as e:
                todo.remove(j)
                refused.append(f"{j.name}: {e}")
                print(f"{j.name}: not started: {e}", flush=True)
        return None

    def take() -> Job | None:
        while True:
            with lock:
                if failures or not todo:
                    return None
                job = first_ready()
                if job is not None:
                    todo.remove(job)
                    busy[0] += 1
                    return job
                if not busy[0]:
                    failures.append("no job can start: " + ", ".join(j.name for j in todo) + " wait for inputs no job makes")
                    return None
            time.sleep(5)

    def lane(number: int) -> None:
        while (job := take()) is not None:
            say = lambda text, n=job.name: print(f"[lane {number}] {time.strftime('%H:%M')} {n}: {text}", flush=True)  # noqa: E731
            try:
                job.work(say)
            except BaseException as e:  # noqa: BLE001 - a lane must never die quietly
                failures.append(f"{job.name}: {runs.one_line(e)}")
                say(f"FAILED: {runs.one_line(e)}")
                if not isinstance(e, SystemExit):
                    traceback.print_exc()
            with lock:
                busy[0] -= 1

    threads = [threading.Thread(target=lane, args=(i + 1,)) for i in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures or refused:
        raise SystemExit("the study stopped: " + "; ".join(failures + refused))


STUDIES = ("v2", "v3", "v3t")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--study", default="v3", help="v2, v3 (part P), v3t (part T), or several: v3,v3t")
    p.add_argument("--lanes", type=int, default=2, help="jobs at once, sharing the cores (2 lanes on 2 cores: one each)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: every run and decoding on the one GPU, fp32")
    p.add_argument("--smoke", action="store_true", help="toy sizes in runs/mini2-smoke, runs/mini3-smoke (v3: after v2's)")
    p.add_argument("--report_only", action="store_true", help="the reports from the kept results alone")
    p.add_argument("--seeds", default="1,2,3,4,5,6", help="v2: seeds of SFT and Relay (1 is the pilot's)")
    p.add_argument("--extra", default="", help="v2: objectives fine-tuned once, seed 1 (rollout, relay_sg)")
    p.add_argument("--lrs", default="0.0003,0.001", help="v2: the pilot's learning rates")
    p.add_argument("--prebuilt", action="store_true", help="the data carried in --data_dir (files or .gz) instead "
                   "of building it; the base (v2: stage B, v3: B3) must be kept (a GPU loan: docs/gpu.md)")
    p.add_argument("--sandbox", default="auto", help="where judged programs run (eval_code.py --sandbox: auto, bwrap, "
                   "namespaces, or unsafe: only where nothing isolates, recorded in each result)")
    for key, what in (("data_dir", "the data"), ("runs", "run folders"), ("kept", "kept bf16 models"),
                      ("out", "kept results and the report")):
        p.add_argument(f"--{key}", default=None, help=f"{what}, instead of the study's own (one study only)")
    args = p.parse_args(argv)
    args.studies = [s.strip() for s in args.study.split(",") if s.strip()]
    runs.need(args.studies and all(s in STUDIES for s in args.studies) and len(set(args.studies)) == len(args.studies),
              "--study", "v2, v3, v3t, or several of them (v3,v3t)", args.study)
    runs.need(args.lanes >= 1, "--lanes", ">= 1", args.lanes)
    runs.need(args.sandbox in ("auto", "bwrap", "namespaces", "unsafe"), "--sandbox", "auto, bwrap, namespaces or unsafe",
              args.sandbox)
    runs.need(args.device == "cpu" or (args.device == "cuda" and torch_cuda()), "--device", "cpu, or cuda on a GPU",
              args.device)
    args.seeds = runs.seed_list(args.seeds, "--seeds")
    runs.need(1 in args.seeds, "--seeds", "a list that holds 1 (the pilot's seed)", args.seeds)
    args.extra = [o.strip() for o in args.extra.split(",") if o.strip()]
    runs.need(all(o in ("rollout", "relay_sg") for o in args.extra) and len(set(args.extra)) == len(args.extra),
              "--extra", "each of rollout, relay_sg at most once", args.extra)
    try:
        args.lrs = tuple(float(t) for t in args.lrs.split(",") if t.strip())
    except ValueError:
        raise SystemExit(f"--lrs must be comma-separated numbers, got {args.lrs!r}") from None
    runs.need(len(args.lrs) >= 1 and all(0 < lr < 1 for lr in args.lrs), "--lrs", "rates in (0, 1)", args.lrs)
    for key in ("data_dir", "runs", "kept", "out"):
        if getattr(args, key) is not None:
            runs.need(len(args.studies) == 1, f"--{key}", "given with one --study", args.study)
            runs.check_folder(getattr(args, key), f"--{key}")
            setattr(args, key, os.path.relpath(os.path.abspath(getattr(args, key)), runs.ROOT))
    return args


def torch_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def parts_of(args: argparse.Namespace) -> list[Study]:
    """The studies the flags name, with their overrides; each one's kept results read and checked now, not after
    hours of work."""
    parts = []
    for name in args.studies:
        st = study(name, args.smoke)
        if not args.smoke:
            st.seeds, st.extra, st.lrs = tuple(args.seeds), tuple(args.extra), args.lrs
        st.device, st.lanes, st.prebuilt, st.sandbox = args.device, args.lanes, args.prebuilt, args.sandbox
        for key in ("data_dir", "runs", "kept", "out"):
            if getattr(args, key) is not None:
                setattr(st, key, getattr(args, key))
        if args.out is not None and name != "v3t":  # the pins travel with the results (T's are v2's)
            st.pins = os.path.join(st.out, "data.json")
        if os.path.isdir(st.out):
            mini_report_v2.kept(st.out, pins=st.pins)
        elif args.report_only:
            raise SystemExit(f"{st.out} is missing: no kept results to report (--out)")
        if name == "v2" and not args.report_only and not store.is_complete(os.path.join(st.kept, "adapt")) \
                and not store.is_complete(PRETRAIN):
            raise SystemExit(f"{PRETRAIN} holds no kept stage A: restore it (git checkout), or pretrain it again "
                             "(docs/table2_miniature.md: scripts/table2/pretrain_ar.py)")
        parts.append(st)
    return parts


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(runs.ROOT)
    parts = parts_of(args)
    if args.report_only:
        return reports(parts)
    locks = []
    try:
        for st in parts:
            locks.append(common.acquire_lock(st.runs))  # a second study on these folders stops here, in one line
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.lanes))  # the cores, shared by lanes
        for st in parts:
            prepare(st, args.smoke)
        run_lanes(queue(parts), args.lanes)
    finally:
        for path in locks:
            common.release_lock(path)
    reports(parts)


def queue(parts: list[Study]) -> list[Job]:
    """v2's jobs, P's, then T's; with both parts of v3, T's long run waits until every P job is done (the protocol's
    order)."""
    v2 = [j for st in parts if st.name == "v2" for j in v2_jobs(st)]
    p = [j for st in parts if st.name == "v3" for j in p_jobs(st)]
    t = [j for st in parts if st.name == "v3t" for j in t_jobs(st)]
    if p and t:
        long = t[-1]
        t[-1] = Job(long.name, long.work, lambda: all(j.done() for j in p) and long.ready(), long.done)
    return v2 + p + t


def reports(parts: list[Study]) -> None:
    """Each part's report from its kept results (scripts/table2/mini_report_v2.py), figures beside it."""
    for st in parts:
        if not os.path.isdir(st.out) or not mini_report_v2.kept(st.out, pins=st.pins):
            print(f"{st.out} holds no kept results yet: no report")
            continue
        mini_report_v2.report(st.out)


if __name__ == "__main__":
    main()
