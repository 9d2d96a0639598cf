"""scripts/table2/study.py (Table 2 in miniature v3): the plateau rule by hand, the lanes' order and waiting, and a
second study on the same folders refused in one line (v2's too)."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

import common
from scripts.table2 import study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_plateau_rule_by_hand():
    """Evaluations every 100 steps. Rising by 2 points or more within the last three keeps B3 training; the first
    step whose last three are all within 2 points of the best before them stops it; the cap stops it anyway.
    Bugs checked: comparing with the previous evaluation only (stops at 400 in the second case), leaving step 0
    out of "earlier" (no stop at 300 in the first case)."""
    flat = {0: 10.0, 100: 11.0, 200: 11.5, 300: 11.9}
    assert study.plateau(flat, 100, 2000) == 300
    rising = {0: 5.0, 100: 10.0, 200: 15.0, 300: 18.0, 400: 19.0, 500: 19.5, 600: 19.8}
    # at 400: best of 200-400 is 19 >= best before (10) + 2; at 500: 19.5 >= 15 + 2; at 600: 19.8 < 18 + 2 -> stop
    assert study.plateau(rising, 100, 2000) == 600
    assert study.plateau({k: v for k, v in rising.items() if k <= 500}, 100, 2000) is None
    assert study.plateau({0: 0.0, 100: 10.0, 200: 20.0}, 100, 200) == 200  # the cap


def test_lanes_take_the_first_ready_job_and_wait_for_inputs():
    """One lane, three jobs, b waiting for a's output: a, then b (ready once a made it), then c. A job whose inputs
    never come is reported instead of waited for, and the others still run. Bug checked: a lane taking the first
    job whatever its inputs (b would run before a made x)."""
    made, started = set(), []

    def job(name, makes=None):
        def work(say):
            started.append(name)
            if makes:
                made.add(makes)
        return work
    jobs = [study.Job("a", job("a", "x")), study.Job("b", job("b"), ready=lambda: "x" in made), study.Job("c", job("c"))]
    study.run_lanes(jobs, 1)
    assert started == ["a", "b", "c"]  # one lane: a makes x before b is looked at
    started.clear()
    made.clear()
    never = [study.Job("d", job("d"), ready=lambda: False), study.Job("e", job("e"))]
    with pytest.raises(SystemExit, match="no job can start: d"):
        study.run_lanes(never, 2)
    assert started == ["e"]


@pytest.mark.parametrize("part", ["v3", "v2"])
def test_a_second_study_on_the_same_folders_stops_in_one_line(tmp_path, part):
    """The runs folder held by a live process: the driver stops at once, its last line names the holder, and it
    writes nothing. Bug checked: without the study's lock the second study started working (v2's: its last line
    was torchrun's banner, the cause buried in a log)."""
    holder = subprocess.Popen(["sleep", "60"])
    try:
        runs_dir = tmp_path / "runs"
        if part == "v3":
            runs_dir = os.path.join(ROOT, "runs", "mini3-smoke", "v3")
            args = ["--study=v3", "--smoke"]
        else:
            args = ["--study=v2", f"--runs={runs_dir}", f"--out={tmp_path / 'out'}", f"--kept={tmp_path / 'kept'}"]
        os.makedirs(runs_dir, exist_ok=True)
        lock = os.path.join(runs_dir, common.LOCK_FILE)
        with open(lock, "w") as f:
            f.write(f"{holder.pid} {socket.gethostname()}\n")
        try:
            done = subprocess.run([sys.executable, "scripts/table2/study.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        finally:
            os.remove(lock)
        last = (done.stdout + done.stderr).strip().splitlines()[-1]
        assert done.returncode != 0 and "is in use by another run" in last and f"pid {holder.pid}" in last, last
        assert not os.path.exists(tmp_path / "out")
    finally:
        holder.kill()


def test_a_decoding_of_another_run_is_decoded_again(tmp_path):
    """A run trained again elsewhere (its run folder not carried, e.g. B3): a kept decoding whose model digest is not
    this run's checkpoint is moved aside, so every result follows the run that goes on; one of this checkpoint stays, and
so does one that names no digest (v2's, made before decodings named one: decoded again, v2's base would change).
    Decodings of steps the run has not reached again are moved aside before it goes on. Bugs checked: a kept result
    read whatever model it decoded (B3's trace would mix two runs); an earlier run's later steps left in place; a
    second lost run's decodings overwrote the first's in other_runs/."""
    st = study.Study("v3", "data", "pins", (), str(tmp_path / "runs"), str(tmp_path / "out"))
    ckpt = tmp_path / "ckpt-100"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text('{"files": {}}')
    path = study.store.result_path(st.out, "b3", 100, 0.85, "val")
    os.makedirs(os.path.dirname(path))
    record = study.store.stamp(dict(model="b3", step=100, tau=0.85, protocol="val", task_ids=["mini2/val/0"],
                                          base=[1], plus=[1], nfe=[30], model_digest=study.model_digest(str(ckpt))))
    open(path, "w").write(json.dumps(record))
    study.forget_other_model(path, str(ckpt))
    assert os.path.exists(path)  # this run's own decoding stays
    open(path, "w").write(json.dumps(study.store.stamp({**record, "model_digest": None})))
    study.forget_other_model(path, "no-such-checkpoint")
    assert os.path.exists(path)  # v2's decodings name no digest: kept, never decoded again
    open(path, "w").write(json.dumps(record))
    (ckpt / "manifest.json").write_text('{"files": {"x": "y"}}')  # another checkpoint 100
    study.forget_other_model(path, str(ckpt))
    assert not os.path.exists(path) and os.listdir(os.path.join(st.out, "b3", "other_runs", "1")) == [os.path.basename(path)]
    assert study.store.load(st.out) == []  # the moved file is no result of the study
    for step in (0, 100, 200):  # an earlier run's decodings; this run's folder holds ckpt-100 only
        open(study.store.result_path(st.out, "b3", step, 0.85, "val"), "w").write(json.dumps(record))
    os.makedirs(tmp_path / "runs" / "b3" / "ckpt-100")
    (tmp_path / "runs" / "b3" / "ckpt-100" / "manifest.json").write_text('{"files": {}}')  # a complete checkpoint
    os.makedirs(tmp_path / "runs" / "b3" / "ckpt-200")  # one cut short while it was saved: not reached
    study.forget_unreached(st, "b3", set(study.store.kept_steps(str(tmp_path / "runs" / "b3"))))
    assert sorted(os.listdir(os.path.join(st.out, "b3"))) == ["other_runs", "step_0_val_tau_0.85.json",
                                                               "step_100_val_tau_0.85.json"]
    open(path, "w").write(json.dumps(study.store.stamp({**record, "nfe": [31]})))  # a second lost run's step 100
    study.forget_other_model(path, str(ckpt))  # goes beside the first's, which stays as it was
    assert [json.load(open(os.path.join(st.out, "b3", "other_runs", n, os.path.basename(path))))["nfe"]
            for n in ("1", "2")] == [[30], [31]] and not os.path.exists(path)


def fake_b3(tmp_path, monkeypatch, val_plus: dict[int, float], trained: list, keeps: list):
    """A Study whose training makes empty complete checkpoints (each call recorded in trained) and whose validation
    decoding of B3's step s keeps val_plus[s] as a kept result would (keeping a copy: recorded in keeps, with what the
    copy's folder held before): b3_job's staging without any model."""
    st = study.Study("v3", "data", "pins", (), str(tmp_path / "runs"), str(tmp_path / "out"))
    st.b3_every, st.b3_stage, st.b3_rows = 100, 200, 32
    monkeypatch.setattr(study, "kept_b3", lambda st: str(tmp_path / "kept" / "b3"))

    def train(st, config, name, args, say, max_iters=None):
        trained.append((name, max_iters, [a for a in args if a.startswith(("--init_from", "--data_start"))]))
        for step in range(25, max_iters + 1, 25):
            os.makedirs(os.path.join(st.runs, name, f"ckpt-{step}"), exist_ok=True)
            open(os.path.join(st.runs, name, f"ckpt-{step}", "manifest.json"), "w").write(f'{{"s": {step}}}')
        open(os.path.join(st.runs, name, "metrics.jsonl"), "w").write("{}")
        return os.path.join(st.runs, name)

    def decode(st, model_dir, name, step, carry, jobs):
        path = study.store.result_path(st.out, name, step, 0.85, "val")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").write(json.dumps({"plus": [1] * int(val_plus[step]) + [0] * (100 - int(val_plus[step]))}))
        return [json.load(open(path))]

    def keep(src, dst, step=None):
        keeps.append((src, dst, step, sorted(os.listdir(os.path.dirname(dst))) if os.path.isdir(os.path.dirname(dst)) else []))
        os.makedirs(dst, exist_ok=True)
        open(os.path.join(dst, "manifest.json"), "w").write(json.dumps({"from": src}))

    monkeypatch.setattr(study, "train", train)
    monkeypatch.setattr(study, "decode", decode)
    monkeypatch.setattr(study.store, "keep", keep)
    monkeypatch.setattr(study.store, "read_kept", lambda path: json.load(open(path)))
    monkeypatch.setattr(study, "regime", lambda st: {"passed": None})
    return st


def test_b3_trains_in_stages_that_a_new_machine_goes_on_from(tmp_path, monkeypatch):
    """B3 rising to step 400, then flat (plateau stop at 600, stages of 200): stage 1 from stage B, stages 2 and 3
    each from the kept copy of the stage before, reading on at row 200 x 32 x (stage - 1), trained to their own
    step 200; stage ends are kept (with B3's step) while B3 goes on, not at its stop, each removed once a later one
    or B3 is kept. Then a new machine (no run folders) that holds the kept stage of 400: nothing of it is trained again.
    Bugs checked: a stage started from its own run's checkpoint, or from row 0; a lost run folder trained again from
    step 0; the stop kept as a stage too; a stage copy left beside a later one or the kept B3."""
    trained, keeps = [], []
    val_plus = {0: 5, 100: 10, 200: 14, 300: 19, 400: 20, 500: 20, 600: 20}
    st = fake_b3(tmp_path, monkeypatch, val_plus, trained, keeps)
    study.b3_job(st, say=lambda text: None)
    kept = str(tmp_path / "kept" / "b3")
    assert json.load(open(os.path.join(st.out, "b3.json")))["stop"] == 600
    assert trained == [("b3", 100, ["--init_from=reference/mini2/adapt"]), ("b3", 200, ["--init_from=reference/mini2/adapt"]),
                       ("b3_from_200", 100, [f"--init_from={kept}_stage_200", "--data_start=6400"]),
                       ("b3_from_200", 200, [f"--init_from={kept}_stage_200", "--data_start=6400"]),
                       ("b3_from_400", 100, [f"--init_from={kept}_stage_400", "--data_start=12800"]),
                       ("b3_from_400", 200, [f"--init_from={kept}_stage_400", "--data_start=12800"]),
                       ("b3_from_400", 200, [f"--init_from={kept}_stage_400", "--data_start=12800"])]
    runs_dir = st.runs
    assert keeps == [(f"{runs_dir}/b3/ckpt-200", f"{kept}_stage_200", 200, []),
                     (f"{runs_dir}/b3_from_200/ckpt-200", f"{kept}_stage_400", 400, ["b3_stage_200"]),
                     (f"{runs_dir}/b3_from_400/ckpt-200", kept, 600, ["b3_stage_400"])]
    assert os.listdir(tmp_path / "kept") == ["b3"]
    assert sorted(os.listdir(os.path.join(st.out, "b3"))) == [
        "stage_0", "stage_200", "stage_400", *(f"step_{s}_val_tau_0.85.json" for s in (0, 100, 200, 300, 400, 500, 600))]
    # a new machine while stage 3 trained: only what the repository keeps (the stage of 400, decodings)
    for gone in (st.runs, kept, os.path.join(st.out, "b3.json"), study.store.result_path(st.out, "b3", 600, 0.85, "val")):
        shutil.rmtree(gone) if os.path.isdir(gone) else os.remove(gone)
    os.makedirs(f"{kept}_stage_400")
    open(f"{kept}_stage_400/manifest.json", "w").write("{}")
    trained.clear()
    study.b3_job(st, say=lambda text: None)
    assert [t[:2] for t in trained] == [("b3_from_400", 100), ("b3_from_400", 200), ("b3_from_400", 200)]
    assert "step_500_val_tau_0.85.json" in os.listdir(os.path.join(st.out, "b3", "other_runs", "1"))  # stage 3's, lost


def test_t_s_long_run_waits_for_every_p_job(tmp_path):
    """With both parts in one queue, the 900-step Relay is the last job and is not ready while any P job is left.
    Bug checked: the long run queued like any other T job (a free lane would start six hours of it first)."""
    parts = [study.study("v3", smoke=True), study.study("v3t", smoke=True)]
    for st in parts:  # nothing kept yet, whatever a smoke run left in the repository's runs/
        st.runs, st.out = str(tmp_path / "mini3-smoke" / st.name), str(tmp_path / "mini3-smoke" / st.name / "results")
    jobs = study.queue(parts)
    assert jobs[-1].name == "v3t relay_steps900_s1" and [j.name for j in jobs][0] == "v3 b3"
    assert not all(j.done() for j in jobs[:-1] if j.name.startswith("v3 "))
    assert not jobs[-1].ready()


def test_regime_check_a_is_read_before_the_first_pair_trains(tmp_path, monkeypatch):
    """B3 below 20% validation plus: the first pair is refused in one line as soon as the kept B3 is decoded, before
    SFT s1 exists; B3 at 20% or more: the first pair may start, the later seeds wait for SFT s1, which then decides (b).
    Bugs checked: (a) read only once SFT s1 was decoded (the first pair trained hours from a base that fails (a));
    the first pair started before the kept B3's decoding was kept; (b) not read (a 12-point jump passed)."""
    st = study.Study("v3", "data", "pins", (), str(tmp_path / "runs"), str(tmp_path / "out"))
    monkeypatch.setattr(study, "b3_done", lambda st: True)
    os.makedirs(st.out)
    (tmp_path / "out" / "b3.json").write_text(json.dumps({"stop": 500}))

    def keep(name, step, solved):
        path = study.store.result_path(st.out, name, step, 0.85, "val")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        ids = [f"mini2/val/{i}" for i in range(100)]
        record = dict(model=name, step=step, tau=0.85, protocol="val", task_ids=ids, base=[1] * 100,
                      plus=[1] * solved + [0] * (100 - solved), nfe=[30] * 100)
        open(path, "w").write(json.dumps(study.store.stamp(record)))
    assert study.regime_passed(st, first_pair=True) is False  # B3 kept, its decoding not yet: wait
    keep("base", 500, 19)
    with pytest.raises(SystemExit, match=r"regime check failed \(B3 19.0%, SFT s1 not run"):
        study.regime_passed(st, first_pair=True)
    keep("base", 500, 21)
    assert study.regime_passed(st, first_pair=True) and not study.regime_passed(st)  # later seeds wait for SFT s1
    keep("sft_s1", 200, 26)
    assert study.regime_passed(st) and study.regime(st)["passed"]
    keep("sft_s1", 200, 33)
    with pytest.raises(SystemExit, match=r"B3 21.0%, SFT s1 33.0%"):
        study.regime_passed(st)


def test_each_study_s_kept_results_are_read_against_its_own_pins(monkeypatch):
    """Before any work, every kept result of each named study is checked against that study's data pins: T's
    results (results/mini_study_v3_t/) against v2's data.json, which pins the data T reads; a damaged file of any
    study stops the driver there. Bug checked: T's read against a data.json of its own folder, which has none
    (the driver refused to start: "results/mini_study_v3_t/data.json is missing")."""
    monkeypatch.chdir(ROOT)
    parts = study.parts_of(study.parse_args(["--study=v2,v3,v3t", "--report_only"]))
    assert [st.pins for st in parts] == ["results/mini_study_v2/data.json", "results/mini_study_v3/data.json",
                                         "results/mini_study_v2/data.json"]
