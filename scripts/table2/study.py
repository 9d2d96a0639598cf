"""Table 2 in miniature v3: its two parts, one driver (docs/table2_v3_protocol.md).

    python scripts/table2/study.py --study=v3             # P, the paper's regime: data, B3, the fine-tunes, decodings
    python scripts/table2/study.py --study=v3t            # T, why v2 came out the other way (v2's base and data)
    python scripts/table2/study.py --study=v3,v3t         # both in one queue on two lanes, P's jobs first
    python scripts/table2/study.py --study=v3 --smoke     # toy sizes: the whole pipeline in minutes (runs/mini3-smoke)

Each job is skipped when its results are kept in the study's --out, so a killed study resumes with the same command;
an interrupted training run resumes from its last checkpoint. A lane takes the first job whose inputs exist (P's
fine-tunes wait for B3, and all but seed 1's pair for the regime check). Every decoding is one JSON per (model, step,
protocol, tau), stamped with the study, the data file's sha256, the model's manifest digest, a digest of its task ids
and of its whole content (scripts/table2/store.py: stamp).
"""
import argparse
import glob
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
from scripts.table2 import mini_report_v2, mini_study_v2, store  # noqa: E402

PY = sys.executable
CARRY = store.CARRY
EVAL_ARGS = mini_study_v2.EVAL_ARGS
FILES = {"test": "test.jsonl", "reworded": "test_reworded.jsonl", "val": "val.jsonl"}
VAL = ("val", 0.85)


@dataclass
class Study:
    """Where a part of v3 reads and writes, and its sizes (smoke: toy ones)."""
    name: str
    data_dir: str
    pins: str  # the data.json of sha256 every file read must match
    pinned: tuple[str, ...]
    runs: str
    out: str
    taus: tuple[float, ...] = (0.7, 0.85, 0.95)
    val_tasks: int = 200
    b3_every: int = 100  # B3: steps between validation decodings
    b3_cap: int = 2000
    b3_stage: int = 200  # B3 trains in stages of this many steps (b3_checkpoint)
    b3_rows: int = 32  # rows per B3 step (config/fastdllm_mini3_b3.py; smoke: SMOKE_FINETUNE's 2 x 2)
    capable: float = 20.0  # regime check (a): B3's validation pass@1 plus, in points (smoke: 0, so the fine-tunes run)
    finetune_args: list[str] = field(default_factory=list)
    device: str = "cpu"
    lanes: int = 2

    def protocol(self) -> list[tuple[str, float]]:
        """A P fine-tune's decodings: test tasks at each tau, held-out wording and validation at tau 0.85."""
        return [("test", tau) for tau in self.taus] + [("reworded", 0.85), VAL]


P_FILES = ("adapt.jsonl", "train.jsonl", "val.jsonl", "val_rows.jsonl", "test.jsonl", "test_reworded.jsonl")
V3_DATA = ["--n_adapt_tasks=30000"]
SMOKE_DATA = [*mini_study_v2.SMOKE_DATA[:1], "--n_adapt_tasks=60", *mini_study_v2.SMOKE_DATA[2:]]
SMOKE_FINETUNE = ["--max_iters=4", "--save_interval=2", "--val_interval=2", "--device_batch_size=2",
                  "--gradient_accumulation_steps=2", "--effective_batch=0", "--warmup_iters=1"]


def study(name: str, smoke: bool) -> Study:
    if name == "v3":
        s = Study("v3", "data/mini3", "results/mini_study_v3/data.json", P_FILES, "runs/mini3/p", "results/mini_study_v3")
    else:  # T reads v2's data, pinned by v2's own data.json
        s = Study("v3t", "data/mini2", "results/mini_study_v2/data.json", mini_study_v2.STUDY_FILES, "runs/mini3/t",
                  "results/mini_study_v3_t")
    if smoke:
        s.data_dir, s.runs, s.out = f"data/mini3-smoke-{name}", f"runs/mini3-smoke/{name}", f"runs/mini3-smoke/{name}/results"
        s.pins = os.path.join(s.out, "data.json")
        s.taus, s.val_tasks, s.b3_every, s.b3_cap, s.finetune_args = (0.85,), 4, 2, 8, SMOKE_FINETUNE
        s.b3_stage, s.b3_rows = 4, 4
        s.capable = 0.0
    return s


def kept_b3(st: Study) -> str:
    return os.path.join(os.path.dirname(st.runs), "kept-smoke-b3") if "smoke" in st.runs else "reference/mini3/b3"


# -----------------------------------------------------------------------------
# data


def prepare(st: Study, smoke: bool) -> None:
    """Build the data unless it is there (v2's build for T), then check every file against the study's pins."""
    if not os.path.exists(os.path.join(st.data_dir, "build.json")):
        runs.sh([PY, "-m", "fastdllm.mini_data", "--out_dir=data/mini"])
        size = SMOKE_DATA if smoke else (V3_DATA if st.name == "v3" else [f"--n_adapt_tasks={mini_study_v2.ADAPT_TASKS}"])
        runs.sh([PY, "-m", "fastdllm.mini_data_v2", "--corpus_dir=data/mini", f"--out_dir={st.data_dir}", *size])
    check_pins(st)


def check_pins(st: Study) -> None:
    """Each file the study reads has the sha256 kept in st.pins (written the first time, for v3 only)."""
    found = {name: common.file_sha256(os.path.join(st.data_dir, name)) for name in st.pinned}
    if not os.path.exists(st.pins):
        if st.name == "v3t" and "smoke" not in st.runs:
            raise SystemExit(f"{st.pins} is missing: T reads v2's data as v2 pinned it (git checkout {st.pins})")
        os.makedirs(os.path.dirname(st.pins), exist_ok=True)
        return runs.write_marker(st.pins, {"files": f"what scripts/table2/study.py --study={st.name} reads",
                                           "sha256": found})
    try:
        with open(st.pins) as f:
            expected = json.load(f)["sha256"]
        wrong = [name for name in st.pinned if found[name] != expected[name]]
    except (json.JSONDecodeError, KeyError, TypeError):
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
                     f"--device={st.device}", "--workers=1"], log=os.path.join(st.runs, "eval", f"{name}.log"), echo=False)
            store.compact(out, path, dict(
                study=st.name, model=name, step=step, tau=tau, protocol=protocol, relay_carry=carry, device=st.device,
                data_file=FILES[protocol], data_sha256=common.file_sha256(data), model_digest=model_digest(model_dir),
                digest=None))
        kept.append(store.read_kept(path))
    return kept


def forget_other_model(path: str, model_dir: str) -> None:
    """A kept decoding of another model under this name (a run trained again on another machine, whose run folder
    was not carried) is moved aside, so that every result follows the run that goes on."""
    if os.path.exists(path) and store.read_kept(path).get("model_digest") != model_digest(model_dir):
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
    base = "reference/mini2/adapt" if "smoke" not in st.runs else mini_study_v2.parse_args(["--smoke"]).kept + "/adapt"
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
                        done=lambda o=o, s=s: p_finished(st, o, s)))
    return jobs


def p_finished(st: Study, objective: str, seed: int) -> bool:
    """Every decoding of the run's protocol is kept (at its last step, 200) and readable."""
    name = f"{objective}_s{seed}"
    folder = os.path.join(st.out, name)
    steps = {int(f.split("_")[1]) for f in os.listdir(folder) if f.startswith("step_")} if os.path.isdir(folder) else set()
    return any(all(os.path.exists(store.result_path(st.out, name, step, tau, where)) for where, tau in st.protocol())
               for step in steps)


# -----------------------------------------------------------------------------
# T: rate, data seen and training length on v2's base


V2_ARGS = ["--init_from=reference/mini2/adapt", "--data=data/mini2/train.jsonl", "--val_data=data/mini2/val_rows.jsonl",
           "--log_interval=1"]
V2_RATE = {"sft": 0.001, "relay": 0.0003}


def v2_args(st: Study, seed: int, lr: float) -> list[str]:
    if "smoke" in st.runs:
        kept = mini_study_v2.parse_args(["--smoke"]).kept
        args = [f"--init_from={kept}/adapt", f"--data={st.data_dir}/train.jsonl",
                f"--val_data={st.data_dir}/val_rows.jsonl", "--log_interval=1"]
    else:
        args = V2_ARGS
    return [f"--seed={seed}", f"--learning_rate={lr}", *args]


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
    step = mini_study_v2.chosen_step(run)
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
    """The run's test decoding is kept (written last by both kinds of T job)."""
    folder = os.path.join(st.out, name)
    return os.path.isdir(folder) and any(f.endswith("_test_tau_0.85.json") for f in os.listdir(folder))


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--study", default="v3", help="v3 (part P), v3t (part T), or both: v3,v3t")
    p.add_argument("--lanes", type=int, default=2, help="jobs at once, sharing the cores (2 lanes on 2 cores: one each)")
    p.add_argument("--smoke", action="store_true", help="toy sizes in runs/mini3-smoke (needs the v2 smoke's stage B)")
    p.add_argument("--report_only", action="store_true", help="the reports from the kept results alone")
    args = p.parse_args(argv)
    args.studies = [s.strip() for s in args.study.split(",") if s.strip()]
    runs.need(args.studies and all(s in ("v3", "v3t") for s in args.studies) and len(set(args.studies)) == len(args.studies),
              "--study", "v3, v3t or v3,v3t", args.study)
    runs.need(args.lanes >= 1, "--lanes", ">= 1", args.lanes)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(runs.ROOT)
    parts = [study(name, args.smoke) for name in args.studies]
    if args.report_only:
        return reports(parts)
    locks = []
    try:
        for st in parts:
            locks.append(common.acquire_lock(st.runs))  # a second study on these folders stops here, in one line
        for st in parts:
            prepare(st, args.smoke)
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.lanes))  # the cores, shared by lanes
        run_lanes(queue(parts), args.lanes)
    finally:
        for path in locks:
            common.release_lock(path)
    reports(parts)


def queue(parts: list[Study]) -> list[Job]:
    """P's jobs, then T's; with both parts, T's long run waits until every P job is done (the protocol's order)."""
    p = [j for st in parts if st.name == "v3" for j in p_jobs(st)]
    t = [j for st in parts if st.name == "v3t" for j in t_jobs(st)]
    if p and t:
        long = t[-1]
        t[-1] = Job(long.name, long.work, lambda: all(j.done() for j in p) and long.ready(), long.done)
    return p + t


def reports(parts: list[Study]) -> None:
    """Each part's report from its kept results (scripts/table2/mini_report_v2.py), figures beside it."""
    for st in parts:
        if not os.path.isdir(st.out) or not mini_report_v2.kept(st.out, pins=st.pins):
            print(f"{st.out} holds no kept results yet: no report")
            continue
        mini_report_v2.report(st.out)


if __name__ == "__main__":
    main()
