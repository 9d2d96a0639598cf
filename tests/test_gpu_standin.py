"""scripts/gpu/gpu_standin.py: the paper's 7.1M pair on the stand-in, for a GPU loan. Its whole path runs in the GPU
check's smoke test (tests/test_gpu_check.py, which also checks its results and weights); here, the pieces a
smoke run at toy sizes cannot tell right from wrong: the scaled settings, the data check, the matched reading."""
import hashlib
import json
import os

import numpy as np
import pandas as pd
import pytest

from scripts.gpu import gpu_standin
from sudoku.board import MASK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("steps, warmup, decay", [(300_000, 2000, 0.9999), (3000, 20, 0.99), (9600, 64, 0.996875)])
def test_settings_tied_to_300k_steps_keep_their_fraction_of_the_run(steps, warmup, decay):
    """Warm-up 2,000 of 300k steps and an EMA averaging 1 / (1 - 0.9999) = 10,000 steps keep their shares of
    the run: at 3,000 steps, 20 and 100 (decay 0.99), by hand. Fails when the EMA's window is scaled the wrong
    way (checked: decay 1 - 1e-4 * steps / 300k) or the warm-up is the paper's (checked)."""
    assert gpu_standin.scaled_settings(steps) == {"warmup_iters": warmup, "ema_decay": pytest.approx(decay)}


def write_set(path, rows) -> None:
    pd.DataFrame({"question": [q for q, _ in rows], "answer": [a for _, a in rows]}).to_parquet(path)


def digest(rows) -> str:
    """sample.py's record of which puzzles it scored: sha256 of the questions' then the answers' token ids
    (int64; digit d -> 7 + d, blank -> [MASK]), written out here from the puzzle strings."""
    def tokens(text):
        return [MASK if c in ".0" else 7 + int(c) for c in text]
    q = np.array([tokens(q) for q, _ in rows], dtype=np.int64)
    a = np.array([tokens(a) for _, a in rows], dtype=np.int64)
    return hashlib.sha256(q.tobytes() + a.tobytes()).hexdigest()


def test_the_data_must_hold_the_puzzles_the_cpu_study_scored(tmp_path):
    """The carried data is checked against the CPU study's recorded digests before any training: the first
    n puzzles of each set (n as that study scored; 0: all). Passes on the same puzzles with more rows after
    them; refuses, in one line naming the file, a set whose scored puzzles differ. Fails without the check
    (checked) or when the whole file is hashed instead of its first n (checked)."""
    lines = [line.split()[1:] for line in open(os.path.join(ROOT, "tests/data/reference_puzzles.txt"))
             if not line.startswith("#")]
    rows = [(q, a) for q, a in lines[:8]]
    data, study = tmp_path / "data", tmp_path / "study"
    data.mkdir()
    for name, file in gpu_standin.SETS.items():
        write_set(data / file, rows)
        folder = study / "mlm_s1" / gpu_standin.standin_protocol.slug(name)
        folder.mkdir(parents=True)
        n = 0 if name == "test hard cohort" else 5
        kept = {"n": n, "data_source": {"puzzles": {"all": digest(rows[:n] if n else rows)}}}
        (folder / "full_12000.json").write_text(json.dumps(kept))
    gpu_standin.check_same_puzzles(str(data), str(study))
    write_set(data / "test.parquet", rows[:2] + rows[3:4] + rows[2:3] + rows[4:])  # two scored puzzles swapped
    with pytest.raises(SystemExit, match=r"the first 5 puzzles of test.parquet are not those the study in .* scored"):
        gpu_standin.check_same_puzzles(str(data), str(study))


def sweep(points: list[tuple[float, float]], n: int = 100) -> dict:
    """A sample.py τ sweep's results: {τ key: metrics} with batch-1 NFE and exact match."""
    return {f"tau={i}": {"batch1_nfe": nfe, "exact_match": acc, "n": n} for i, (nfe, acc) in enumerate(points)}


def test_the_pair_is_read_at_matched_nfe_on_the_full_protocol_seed_by_seed():
    """Two seeds, each objective's curve a line from NFE 10 to 20: four budgets spread evenly over the
    range, so each mean is the line's value at NFE 15 (by hand: MLM 0.3 and 0.5, Relay 0.45 and 0.6). The
    light results at the same compute (other values) and a seed of MLM alone are not read. Fails when the
    light protocol is read (checked) or seeds are paired out of order (checked)."""
    found = {("mlm", 1, "test", "full", 80): sweep([(10, 0.2), (20, 0.4)]),
             ("mlm", 2, "test", "full", 80): sweep([(10, 0.4), (20, 0.6)]),
             ("relay", 2, "test", "full", 80): sweep([(10, 0.5), (20, 0.7)]),
             ("relay", 1, "test", "full", 80): sweep([(10, 0.3), (20, 0.6)]),
             ("mlm", 3, "test", "full", 80): sweep([(10, 0.9), (20, 0.9)]),
             ("mlm", 1, "test", "light", 80): sweep([(10, 0.9), (20, 0.9)]),
             ("relay", 1, "test", "light", 80): sweep([(10, 0.0), (20, 0.0)])}
    r = gpu_standin.matched(found, "test", 80)
    assert r["seeds"] == [1, 2] and r["budgets"][0] == 10 and r["budgets"][-1] == 20
    assert r["mlm"] == pytest.approx([0.3, 0.5]) and r["relay"] == pytest.approx([0.45, 0.6])
    assert gpu_standin.matched(found, "top1465", 80) is None


def test_bad_options_are_one_line():
    for argv, message in ((["--relay_steps=30"], "--relay_steps must be at least 40"),
                          (["--relay_steps=4002"], "a multiple of --keep_points=4"),
                          (["--train_minutes=0"], "--train_minutes must be > 0"),
                          (["--eval_workers=0"], "--eval_workers must be >= 1")):
        with pytest.raises(SystemExit, match=message):
            gpu_standin.parse_args(argv)


def test_a_run_trained_again_loses_what_was_made_from_its_earlier_weights(tmp_path, monkeypatch):
    """A run trained again (its command changed, or never finished) starts afresh, and its bf16 copies and
    results of the earlier weights go with them: kept, they would be evaluated and reported as the new
    run's. A pair finished with the same commands is not trained again. Fails without the clean-up (checked)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # train_pair shares the cores out through the environment
    args = gpu_standin.parse_args(["--smoke", f"--runs={tmp_path}/runs", f"--out={tmp_path}/out"])
    started = []
    monkeypatch.setattr(gpu_standin.runs, "sh", lambda cmd, log=None, echo=True: started.append(cmd[2]))
    stale = [tmp_path / "runs/relay_s1/kept_bf16/step_40.safetensors", tmp_path / "out/relay_s1/test/full_80.json"]
    for f in stale:
        f.parent.mkdir(parents=True)
        f.write_text("from the earlier weights")
    gpu_standin.train_pair(args)
    assert sorted(started) == ["config/mlm_tied.py", "config/relay_tied.py"]
    assert not any(f.exists() for f in stale)
    gpu_standin.train_pair(args)
    assert len(started) == 2
