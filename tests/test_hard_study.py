"""scripts/sudoku/hard_study.py: Table 1's columns over seeds and accuracy at matched NFE, from kept sample.py
results (no decoding here), against values computed by hand.

Planted bugs seen to fail: the frontier read on the batch-512 NFE instead of the per-puzzle count;
unfinished runs (no DONE.json) included; the seeds' spread replaced by the first seed's value; the
token accuracy read from another key; kept results of runs not on this disk ignored, or decoded anew;
a stale kept result reported for a run trained again; results on other puzzles merged as seeds.
"""
import json
import os

import pytest

from scripts.sudoku import hard_study

TAU_KEYS = ("0.01", "0.02", "0.05", "0.10", "0.15", "0.25")


def kept(tmp_path, run: str, nfes: list[float], accs: list[float], done: bool = True, token_acc: float = 0.5,
         digest: str = "abc") -> None:
    """A finished run directory and the sample.py JSON hard_study would have written for it (`digest`:
    the hash of the puzzles it scored)."""
    run_dir = tmp_path / "runs" / run
    run_dir.mkdir(parents=True)
    if done:
        (run_dir / "DONE.json").write_text("{}")
    results = {k: {"exact_match": a, "token_accuracy": token_acc, "batch1_nfe": f, "batch_nfe": 64.0, "mean_nfe": f - 1,
                   "legal_rate": a, "violations_final": 1.0, "violating_snapshots": 2.0, "n": 500}
               for k, f, a in zip(TAU_KEYS, nfes, accs)}
    out = tmp_path / "runs" / "study" / run
    out.mkdir(parents=True)
    source = {"data": "top1465.parquet", "data_dir": "data", "puzzles": {"all": digest}}
    kept_json = {"data_source": source, "checkpoints": [{"results": {"all": results}}]}
    (out / "Top1465.json").write_text(json.dumps(kept_json))


def test_table_and_matched_nfe_from_kept_results(tmp_path, monkeypatch, capsys):
    nfe = [40, 35, 30, 25, 20, 15]
    kept(tmp_path, "mlm_s1", nfe, [0.30, 0.28, 0.25, 0.20, 0.10, 0.05], token_acc=0.40)
    kept(tmp_path, "mlm_s2", nfe, [0.40, 0.38, 0.35, 0.30, 0.20, 0.15])
    kept(tmp_path, "relay_cold_s1", [44, 40, 36, 32, 28, 24], [0.50, 0.48, 0.45, 0.40, 0.35, 0.30], token_acc=0.60)
    kept(tmp_path, "rollout_cold_s1", nfe, [0.9] * 6, done=False)  # unfinished: left out
    monkeypatch.setattr(hard_study, "eval_sets", lambda args: {"Top1465": []})
    hard_study.main([f"--runs={tmp_path / 'runs'}"])
    text = (tmp_path / "runs" / "study" / "hard_study.md").read_text()
    # τ = 0.15: exact 10% and 20%, blank cells right 40% and 50%
    assert "| Top1465 (n = 500) | MLM | 2 | 15.0 ± 7.1 | 45.0 ± 7.1 | 20.00 ± 0.00 |" in text
    assert "| Top1465 (n = 500) | Relay | 1 | 35.0 | 60.0 | 28.00 |" in text
    assert "Rollout" not in text
    # budgets 24 .. 40 (the range all three curves cover); at 24: MLM 18% and 28% (between NFE 20 and 25),
    # Relay 30% +- sqrt(.3 * .7 / 500); at 40: MLM 30% and 40%, Relay 48%
    assert "| MLM (2) | 23.0 ± 7.1 | 29.3 ± 7.1 | 32.8 ± 7.1 | 35.0 ± 7.1 |" in text
    assert "| Relay (1) | 30.0 ± 2.0 |" in text and "48.0 ± 2.2 |" in text
    assert (tmp_path / "runs" / "study" / "hard_study.png").exists()


def test_sweeps_that_miss_each_other_are_named_with_their_nfe_spans(tmp_path, monkeypatch):
    """Catches: the spans taken from one seed only, or from the accuracies instead of the NFE."""
    kept(tmp_path, "mlm_s1", [16, 15, 13, 11, 10, 8], [0.7] * 6)
    kept(tmp_path, "mlm_s2", [14, 13, 12, 10, 9, 7.5], [0.7] * 6)
    kept(tmp_path, "relay_cold_s1", [32, 27, 23, 19, 17, 14], [0.6] * 6)
    kept(tmp_path, "relay_cold_s2", [28, 24, 20, 18, 16.5, 17], [0.6] * 6)
    monkeypatch.setattr(hard_study, "eval_sets", lambda args: {"Top1465": []})
    hard_study.main([f"--runs={tmp_path / 'runs'}"])
    text = (tmp_path / "runs" / "study" / "hard_study.md").read_text()
    assert ("Top1465: no NFE range is covered by every run (NFE per puzzle each objective's runs cover together: "
            "MLM 7.5-16.0, Relay 14.0-32.0)") in text


def test_kept_results_are_reported_without_their_runs(tmp_path, monkeypatch, capsys):
    """Results committed from another machine (no run directory here) count as seeds; a set with neither
    a kept result nor a checkpoint is left out with a note, never decoded.
    Catches: kept-only runs ignored; sample.py called for a run that is not on this disk."""
    nfe = [40, 35, 30, 25, 20, 15]
    kept(tmp_path, "mlm_s1", nfe, [0.3] * 6)
    kept(tmp_path, "relay_cold_s1", nfe, [0.5] * 6)
    (tmp_path / "runs" / "relay_cold_s1" / "DONE.json").unlink()
    (tmp_path / "runs" / "relay_cold_s1").rmdir()
    study = tmp_path / "runs" / "study"
    (study / "mlm_s1" / "hard_test_split.json").write_text((study / "mlm_s1" / "Top1465.json").read_text())
    monkeypatch.setattr(hard_study.runs, "sh", lambda cmd: (_ for _ in ()).throw(AssertionError(f"decoded: {cmd}")))
    monkeypatch.setattr(hard_study, "eval_sets", lambda args: {"Top1465": [], "hard test split": [], "easy mix": None})
    hard_study.main([f"--runs={tmp_path / 'runs'}"])
    text = (study / "hard_study.md").read_text()
    assert "| Top1465 (n = 500) | Relay | 1 | 50.0 |" in text
    assert "| hard test split (n = 500) | MLM | 1 |" in text and "| hard test split (n = 500) | Relay" not in text
    assert "easy mix" not in text
    out = capsys.readouterr().out
    assert "hard test split: no kept result of relay_cold_s1 and its checkpoint" in out
    assert "easy mix: no kept result of mlm_s1 and its data is not here" in out


def test_a_run_trained_again_after_its_kept_result_is_evaluated_anew(tmp_path, monkeypatch):
    """Catches: a stale kept result (an earlier training under the same name) reported for the new run."""
    kept(tmp_path, "mlm_s1", [40, 35, 30, 25, 20, 15], [0.3] * 6)
    json_path = tmp_path / "runs" / "study" / "mlm_s1" / "Top1465.json"
    os.utime(json_path, (1_000_000, 1_000_000))  # the kept result is older than the run's DONE.json
    fresh = json.loads(json_path.read_text())
    fresh["checkpoints"][0]["results"]["all"]["0.15"]["exact_match"] = 0.9

    def decode(cmd):
        out = next(a for a in cmd if a.startswith("--out="))[len("--out="):]
        with open(out, "w") as f:
            json.dump(fresh, f)
    monkeypatch.setattr(hard_study.runs, "sh", decode)
    monkeypatch.setattr(hard_study, "eval_sets", lambda args: {"Top1465": []})
    hard_study.main([f"--runs={tmp_path / 'runs'}"])
    assert "| Top1465 (n = 500) | MLM | 1 | 90.0 |" in (tmp_path / "runs" / "study" / "hard_study.md").read_text()


def test_results_on_other_puzzles_are_not_merged_as_seeds(tmp_path, monkeypatch):
    """A kept result from a machine whose data build scored other puzzles must stop the study.
    Catches: results merged across different test sets (no puzzle check)."""
    nfe = [40, 35, 30, 25, 20, 15]
    kept(tmp_path, "mlm_s1", nfe, [0.3] * 6, digest="abc")
    kept(tmp_path, "relay_cold_s1", nfe, [0.5] * 6, digest="def")
    monkeypatch.setattr(hard_study, "eval_sets", lambda args: {"Top1465": []})
    with pytest.raises(SystemExit, match=r"relay_cold_s1/Top1465.json: its all puzzles .* are not those of"):
        hard_study.main([f"--runs={tmp_path / 'runs'}"])


def test_only_the_named_runs_are_evaluated(tmp_path, monkeypatch):
    """--only (one process per core): the other finished runs are neither decoded nor reported, and a
    name that matches nothing stops with one line. Catches: --only ignored; a misspelt name silently
    evaluating nothing."""
    nfe = [40, 35, 30, 25, 20, 15]
    kept(tmp_path, "mlm_s1", nfe, [0.3] * 6)
    kept(tmp_path, "relay_cold_s1", nfe, [0.5] * 6)
    monkeypatch.setattr(hard_study, "eval_sets", lambda args: {"Top1465": []})
    hard_study.main([f"--runs={tmp_path / 'runs'}", "--only=relay_cold_s1"])
    text = (tmp_path / "runs" / "study" / "hard_study.md").read_text()
    assert "| Top1465 (n = 500) | Relay | 1 | 50.0 |" in text and "MLM" not in text
    with pytest.raises(SystemExit, match="--only: no finished run or kept result named relay_s1 in"):
        hard_study.main([f"--runs={tmp_path / 'runs'}", "--only=relay_s1"])  # a misspelt name: one line


def test_bad_flags_are_refused_before_reading_runs(tmp_path):
    """--n < 0 (handed to every sample.py call, each refusing it after loading its model) and an --out that
    is a file (written only at the end): one line naming the flag. Failed before the checks (checked)."""
    (tmp_path / "afile").write_text("keep")
    for argv, flag in ((["--n=-1"], "--n"), ([f"--out={tmp_path / 'afile'}"], "--out")):
        with pytest.raises(SystemExit) as e:
            hard_study.main([f"--runs={tmp_path / 'runs'}", *argv])
        assert flag in str(e.value.code) and "\n" not in str(e.value.code), e.value.code
