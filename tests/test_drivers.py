"""The experiment drivers (scripts/sudoku/reproduce_cpu.py, compare_adaptation.py, budget_study.py) and Table 2 in
miniature's scripts (python -m fastdllm.mini_data, scripts/table2/pretrain_ar.py, study.py, mini_report_v2.py,
mini_check.py, rate_check.py): a bad flag, or an input a flag names that cannot be used, stops the script in one line
naming it, before any data is built, run trained or model decoded, and with nothing written (each starts with work that takes
minutes, and used to meet the bad input only then, or never: a silently wrong run)."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from fastdllm import mini_data, mini_data_v2
from scripts import runs
from scripts.sudoku import budget_study, compare_adaptation, reproduce_cpu
from scripts.table2 import mini_check, mini_report_v2, pretrain_ar, rate_check, study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVERS = {"reproduce_cpu": reproduce_cpu, "compare_adaptation": compare_adaptation, "budget_study": budget_study,
           "mini_data": mini_data, "pretrain_ar": pretrain_ar,
           "mini_check": mini_check, "study": study, "mini_report_v2": mini_report_v2,
           "mini_data_v2": mini_data_v2, "rate_check": rate_check}
# where each script's first slow work starts (patched to fail the test), besides runs.sh / ensure_data / train / evaluate
WORK = {"mini_data": ("build",), "pretrain_ar": ("train",), "mini_check": ("decode",), "mini_data_v2": ("build",),
        "study": ("run_lanes", "prepare"), "mini_report_v2": ("report",), "rate_check": ("decode",)}
# folders a case does not name go under tmp_path, so that nothing lands in the repository
DEFAULTS = {"reproduce_cpu": ["--runs=TMP/runs", "--data_dir=TMP/data_dir"],
            "compare_adaptation": ["--runs=TMP/runs", "--data_dir=TMP/data_dir"],
            "budget_study": ["--runs=TMP/runs", "--data_dir=TMP/data_dir"],
            "mini_data": ["--out_dir=TMP/out"], "pretrain_ar": ["--out_dir=TMP/out", "--data_dir=DATA"],
            "study": ["--study=v2", "--runs=TMP/runs", "--data_dir=TMP/data_dir", "--kept=TMP/kept", "--out=TMP/out"],
            "mini_data_v2": ["--out_dir=TMP/out", "--corpus_dir=CORPUS"], "rate_check": ["--out=TMP/out", "--runs=PILOT"]}
KEPT = os.path.join("sft_s1", "step_200_full_tau_0.85.json")  # one of the study's kept results
KEPT_V2 = os.path.join("sft_s1", "step_300_test_tau_0.85.json")  # one of v2's, of the kept seed-1 SFT (step 300)

CASES = [
    ("reproduce_cpu", ["--minutes=-1"], "--minutes"),
    ("reproduce_cpu", ["--minutes=nan"], "--minutes"),
    ("reproduce_cpu", ["--n=0"], "--n"),
    ("reproduce_cpu", ["--seeds=abc"], "--seeds"),
    ("reproduce_cpu", ["--seeds=-1"], "--seeds"),
    ("reproduce_cpu", ["--objectives=foo"], "--objectives"),
    ("reproduce_cpu", ["--runs=FILE"], "--runs"),
    ("reproduce_cpu", ["--data_dir=FILE/sub"], "--data_dir"),
    ("compare_adaptation", ["--iters=0", "--parent_iters=5"], "--iters"),
    ("compare_adaptation", ["--parent_iters=-1", "--iters=5"], "--parent_iters"),
    ("compare_adaptation", ["--iters=5", "--parent_iters=5", "--mlm_iters=0"], "--mlm_iters"),
    ("compare_adaptation", ["--minutes=nan"], "--minutes"),
    ("compare_adaptation", ["--parent_minutes=0"], "--parent_minutes"),
    ("compare_adaptation", ["--warmup_iters=-1"], "--warmup_iters"),
    ("compare_adaptation", ["--smoke", "--iters=5"], "--iters"),  # --smoke used to replace it silently
    ("compare_adaptation", ["--runs=FILE"], "--runs"),
    ("budget_study", ["--iters=-3"], "--iters"),
    ("budget_study", ["--minutes=0"], "--minutes"),
    ("budget_study", ["--eval_interval=0"], "--eval_interval"),  # no validation records: nothing to plot
    ("budget_study", ["--seed=1,1"], "--seed"),
    ("budget_study", ["--seed=-2"], "--seed"),
    ("budget_study", ["--smoke", "--iters=50"], "--iters"),
    ("budget_study", ["--minutes=5", "--iters=50"], "--iters"),
    ("budget_study", ["--runs=FILE"], "--runs"),
    ("mini_data", ["--out_dir=FILE/sub"], "--out_dir"),
    ("mini_data", ["--out_dir=FILE"], "--out_dir"),
    ("mini_data", ["--n_test_each=0"], "--n_test_each"),
    ("mini_data", ["--seed=-1"], "--seed"),
    ("mini_data", ["--vocab_size=70000"], "--vocab_size"),  # train.bin's uint16 ids would wrap
    ("mini_data", ["--out_dir=CUT_BUILD"], "build.json"),
    ("pretrain_ar", ["--seed=-1"], "seed"),
    ("pretrain_ar", ["--data_dir=SHORT_TRAIN"], ("train.bin", "seq_len")),
    ("pretrain_ar", ["--data_dir=SHORT_HELDOUT"], ("heldout.bin", "seq_len")),
    ("pretrain_ar", ["--data_dir=ODD_TRAIN"], ("train.bin", "uint16")),
    ("pretrain_ar", ["--data_dir=TMP/missing"], ("train.bin", "fastdllm.mini_data")),
    ("pretrain_ar", ["--out_dir=FILE/sub"], "out_dir"),
    ("mini_check", ["--results=FILE"], "--results"),
    ("mini_check", ["--results=CUT_V2"], KEPT_V2),  # read after minutes of decoding
    ("mini_check", ["--sandbox=none"], "--sandbox"),
    ("mini_check", ["--n=0"], "--n"),
    ("mini_check", ["--kept=TMP"], "--kept"),
    ("mini_check", ["--n=401"], "--n"),  # v2 holds 400 test tasks
    ("study", ["--seeds=abc"], "--seeds"),
    ("study", ["--seeds=2,3"], "--seeds"),  # seed 1 is the pilot's
    ("study", ["--lrs=fast"], "--lrs"),
    ("study", ["--lrs=0"], "--lrs"),
    ("study", ["--extra=sft"], "--extra"),
    ("study", ["--lanes=0"], "--lanes"),
    ("study", ["--device=tpu"], "--device"),
    ("study", ["--kept=FILE/sub"], "--kept"),
    ("study", ["--study=v4"], "--study"),
    ("study", ["--study=v3,v3t"], "given with one --study"),  # one --out (the defaults) for two studies
    ("study", ["--out=CUT"], KEPT),
    ("study", ["--report_only", "--out=NO_NFE"], (KEPT, "nfe")),
    ("study", ["--report_only", "--out=TMP/missing"], "missing"),
    ("mini_report_v2", ["TMP/missing"], "missing"),
    ("mini_report_v2", ["TMP"], "no kept results"),
    ("mini_report_v2", ["CUT"], KEPT),
    ("mini_data_v2", ["--out_dir=FILE/sub"], "--out_dir"),
    ("mini_data_v2", ["--n_val=10", "--n_val_rows=20"], "--n_val_rows"),
    ("mini_data_v2", ["--n_test=0"], "--n_test"),
    ("mini_data_v2", ["--corpus_dir=TMP/missing"], ("--corpus_dir", "fastdllm.mini_data")),
    ("rate_check", ["--n=0"], "--n"),
    ("rate_check", ["--n=401"], "--n"),
    ("rate_check", ["--tau=1"], "--tau"),
    ("rate_check", ["--sandbox=none"], "--sandbox"),
    ("rate_check", ["--out=FILE/sub"], "--out"),
    ("rate_check", ["--runs=TMP/missing"], ("missing", "study.py --study=v2")),
    ("rate_check", ["--out=CUT_RATES"], "sft_s1_lr0.0003_n100_tau_0.85.json"),  # kept by a killed check
]


def token_data(folder, train: int, heldout: int, odd: bool = False) -> None:
    """A data folder as far as pretrain_ar.py reads it before training: the token files' sizes, the tokenizer's name."""
    os.makedirs(folder / "tokenizer")
    np.zeros(train, dtype=np.uint16).tofile(folder / "train.bin")
    np.zeros(heldout, dtype=np.uint16).tofile(folder / "heldout.bin")
    if odd:
        with open(folder / "train.bin", "ab") as f:
            f.write(b"\0")


def kept_results(folder, edit, study: str = "mini_study", kept: str = KEPT) -> None:
    """A copy of one of the study's kept JSONs, its text passed through edit; and a training log beside it."""
    os.makedirs(folder / "sft_s1")
    text = open(os.path.join(ROOT, "results", study, kept)).read()
    (folder / kept).write_text(edit(text))
    shutil.copyfile(os.path.join(ROOT, "results", study, "sft_s1", "train_metrics.jsonl"),
                    folder / "sft_s1" / "train_metrics.jsonl")


def without_nfe(text: str) -> str:
    record = json.loads(text)
    del record["nfe"]
    return json.dumps(record)


def cut_log(folder) -> None:
    kept_results(folder, lambda text: text)
    log = folder / "sft_s1" / "train_metrics.jsonl"
    log.write_text(log.read_text().split("\n", 1)[0] + "\n" + '{"step": 10, "loss')


def pilot_runs(folder) -> None:
    """The pilot's four seed-1 checkpoint folders, as far as rate_check.py looks before decoding."""
    for objective, lr, _ in rate_check.DECODINGS:
        os.makedirs(rate_check.checkpoint(str(folder), objective, lr), exist_ok=True)


def cut_rates(folder) -> None:
    os.makedirs(folder)
    (folder / "sft_s1_lr0.0003_n100_tau_0.85.json").write_text('{"model": "sft_s1_lr0.0003", "ta')


# the inputs a case names by placeholder, each built under tmp_path only when used
INPUTS = {"SHORT_TRAIN": lambda d: token_data(d, 100, 1000), "SHORT_HELDOUT": lambda d: token_data(d, 1000, 100),
          "ODD_TRAIN": lambda d: token_data(d, 1000, 1000, odd=True), "DATA": lambda d: token_data(d, 1000, 1000),
          "NO_NFE": lambda d: kept_results(d, without_nfe), "CUT": lambda d: kept_results(d, lambda text: text[:200]),
          "CUT_V2": lambda d: kept_results(d, lambda text: text[:200], "mini_study_v2", KEPT_V2),
          "CUT_LOG": cut_log, "PILOT": pilot_runs, "CUT_RATES": cut_rates,
          "CORPUS": lambda d: (os.makedirs(d / "tokenizer"), os.makedirs(d / "wheels")),
          "CUT_BUILD": lambda d: (os.makedirs(d), (d / "build.json").write_text('{"args": {"out_d'))}


PLACEHOLDER = re.compile(r"\b(" + "|".join(INPUTS) + r"|FILE|TMP)\b")


def with_inputs(arg: str, tmp_path) -> str:
    """arg with each placeholder replaced by its path under tmp_path (FILE: a file; TMP: tmp_path itself)."""
    def path(match: re.Match) -> str:
        name = match.group(1)
        if name in INPUTS and not (tmp_path / name).exists():
            INPUTS[name](tmp_path / name)
        return str(tmp_path / {"FILE": "afile", "TMP": ""}.get(name, name))
    return PLACEHOLDER.sub(path, arg)


def snapshot(root) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under root."""
    out = {}
    for folder, dirs, files in os.walk(root):
        out.update({os.path.join(folder, d): None for d in dirs})
        out.update({os.path.join(folder, f): open(os.path.join(folder, f), "rb").read() for f in files})
    return out


@pytest.mark.parametrize("driver, argv, flag", CASES, ids=[f"{d}{' '.join(a)}" for d, a, _ in CASES])
def test_bad_flags_stop_a_driver_before_any_work(driver, argv, flag, tmp_path, monkeypatch):
    """Failed on the code before these checks for every case but --objectives=foo, --seeds=abc, pretrain_ar's
    missing data and out_dir under a file (checked: the work started, a traceback came, the message did not name
    the flag or input, or took two lines: argparse's usage and error)."""
    for module, names in ((runs, ("sh", "ensure_data", "train", "evaluate")), (DRIVERS[driver], WORK.get(driver, ()))):
        for name in names:
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail(f"{driver} {argv}: work started"))
    monkeypatch.chdir(ROOT)
    (tmp_path / "afile").write_text("keep")
    given = {a.split("=", 1)[0] for a in argv}
    argv = [with_inputs(a, tmp_path) for a in argv + [d for d in DEFAULTS.get(driver, []) if d.split("=")[0] not in given]]
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as e:
        DRIVERS[driver].main(argv)
    message = e.value.code  # a string: Python prints it to stderr as it is, and exits with status 1
    assert isinstance(message, str) and "\n" not in message, message
    assert all(part in message for part in ((flag,) if isinstance(flag, str) else flag)), message
    assert snapshot(tmp_path) == before
