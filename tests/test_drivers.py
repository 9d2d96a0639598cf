"""The experiment drivers (scripts/reproduce_cpu.py, compare_adaptation.py, budget_study.py): a bad flag stops
the driver in one line naming it, before any data is built or run trained (each starts by building data
that takes minutes, then hands its budget to train_sudoku.py, which refused it only then)."""
import os

import pytest

from scripts import budget_study, compare_adaptation, mini_study, reproduce_cpu, runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVERS = {"reproduce_cpu": reproduce_cpu, "compare_adaptation": compare_adaptation, "budget_study": budget_study,
           "mini_study": mini_study}

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
    ("mini_study", ["--seeds=abc"], "--seeds"),
    ("mini_study", ["--seeds=1,1"], "--seeds"),
    ("mini_study", ["--extra=sft"], "--extra"),
    ("mini_study", ["--extra=rollout,rollout"], "--extra"),
    ("mini_study", ["--lanes=0"], "--lanes"),
    ("mini_study", ["--device=tpu"], "--device"),
    ("mini_study", ["--gate_steps=0"], "--gate_steps"),
    ("mini_study", ["--kept=FILE/sub"], "--kept"),
    ("mini_study", ["--out=FILE"], "--out"),
]


@pytest.mark.parametrize("driver, argv, flag", CASES, ids=[f"{d}{' '.join(a)}" for d, a, _ in CASES])
def test_bad_flags_stop_a_driver_before_any_work(driver, argv, flag, tmp_path, monkeypatch, capsys):
    """Failed on the code before these checks for every case but --objectives=foo and --seeds=abc (checked:
    the data build started, or the message did not name the flag)."""
    for name in ("sh", "ensure_data", "train", "evaluate"):
        if hasattr(runs, name):
            monkeypatch.setattr(runs, name, lambda *a, **k: pytest.fail(f"{driver} {argv}: work started"))
    monkeypatch.chdir(ROOT)
    afile = tmp_path / "afile"
    afile.write_text("keep")
    argv = [a.replace("FILE", str(afile)) for a in argv]
    argv += [f"--{k}={tmp_path / k}" for k in ("runs", "data_dir") if not any(a.startswith(f"--{k}=") for a in argv)]
    with pytest.raises(SystemExit) as e:
        DRIVERS[driver].main(argv)
    message = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in message and "\n" not in message, message
    assert os.listdir(tmp_path) == ["afile"] and afile.read_text() == "keep"


def test_mini_study_reads_its_defaults():
    """The plain command's flags parse (failed when a helper it called was renamed: int_list -> seed_list)."""
    args = mini_study.parse_args([])
    assert args.seeds == [1, 2, 3] and args.extra == ["rollout", "relay_sg"] and args.lanes == 2
