"""scripts/sudoku/standin_study.py and scripts/sudoku/standin_report.py: the crossover and the ladder against values
worked out by hand from made-up kept results, the driver's arguments, and the committed results, their
report and the README's numbers in agreement."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from scripts.sudoku import standin_protocol as P
from scripts.sudoku import standin_report as R
from scripts.sudoku import standin_study as S


def write_result(out, run: str, set_name: str, protocol: str, eq: int, sweep: dict) -> None:
    """A sample.py --out file whose only cohort has `sweep`: {τ key: metrics}."""
    path = P.result_path(str(out), run, set_name, protocol, eq)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"checkpoints": [{"results": {"all": sweep}}]}, f)


def points(*pairs) -> dict:
    """(NFE, exact match) per τ, as sample.py records them."""
    return {f"0.{i}": {"batch1_nfe": nfe, "exact_match": acc, "token_accuracy": acc, "n": 100}
            for i, (nfe, acc) in enumerate(pairs)}


def test_crossover_reads_accuracy_at_matched_nfe_seed_by_seed(tmp_path):
    """Shared NFE range [12, 18] (MLM seed 2 starts at 12, Relay seed 1 ends at 18): budgets 12, 14, 16, 18,
    mean 15. On straight-line curves the mean accuracy over the budgets is the accuracy at 15: MLM
    0.2 + 0.02 * 5 = 0.30 and 0.2 + 0.6 * 3 / 12 = 0.35; Relay 0.3 + 0.02 * 5 = 0.40 and 0.1 + 0.02 * 5 = 0.20."""
    write_result(tmp_path, "mlm_s1", "test", "light", 2000, points((10, 0.2), (20, 0.4)))
    write_result(tmp_path, "mlm_s2", "test", "light", 2000, points((12, 0.2), (24, 0.8)))
    write_result(tmp_path, "relay_s1", "test", "light", 2000, points((10, 0.3), (18, 0.46)))
    write_result(tmp_path, "relay_s2", "test", "light", 2000, points((10, 0.1), (30, 0.5)))
    write_result(tmp_path, "relay_s1", "test", "light", 4000, points((10, 0.3), (20, 0.5)))  # no MLM at 4000
    rows = R.crossover(R.load(str(tmp_path)), "test")
    assert [r["equivalents"] for r in rows] == [2000]
    assert rows[0]["budgets"] == pytest.approx([12, 14, 16, 18])
    assert rows[0]["mlm"] == pytest.approx([0.30, 0.35])
    assert rows[0]["relay"] == pytest.approx([0.40, 0.20])
    table = R.crossover_table(R.load(str(tmp_path)), {"test": "test"})
    # Relay - MLM seed by seed: +0.10 and -0.15: mean -2.5 points, s.d. 0.25 / sqrt(2) = 17.7
    # s.e. (puzzles), 100 each, Agresti-Caffo (p -> (100 p + 1) / 102, variance p(1 - p) / 102):
    # seed by seed sqrt(31*71 + 41*61) / 102 / sqrt(102) = 0.0666 and sqrt(36*66 + 21*81) / ... = 0.0620, mean 0.0643
    assert "| 2,000 | 12.0-18.0 | 32.5 ± 3.5 | 30.0 ± 14.1 | -2.5 ± 17.7 | 6.4 | 2 / 2 |" in table


def test_crossover_pairs_seeds_by_number_not_by_count(tmp_path):
    """MLM seeds 1-2 and Relay seeds 1 and 3 (seed 2 of Relay not yet evaluated, seed 3's already): two
    each, but seed 2 of MLM has no partner, so no difference and no s.e. are claimed. Fails with the
    seeds paired by their count (checked)."""
    for run in ("mlm_s1", "mlm_s2", "relay_s1", "relay_s3"):
        write_result(tmp_path, run, "test", "light", 2000, points((10, 0.2), (20, 0.4)))
    table = R.crossover_table(R.load(str(tmp_path)), {"test": "test"})
    assert "| 2,000 | 10.0-20.0 | 30.0 ± 0.0 | 30.0 ± 0.0 | n/a | n/a | 2 / 2 |" in table


def per_puzzle(nfe: list[int], solved: list[int]) -> dict:
    return {"batch1_nfe": nfe, "solved": "".join(map(str, solved)), "blank_right": [float(s) for s in solved]}


def test_ladder_splits_puzzles_by_rating_and_clues(tmp_path):
    """Seed by seed: MLM seed 2 has no Relay partner yet and is left out. 20 puzzles, 10 rated 0 and 10
    rated 150, all with 25 clues. Rated 0: MLM solves 2 then 4 of 10 at
    NFE 10 then 20, Relay 3 then 5: 30% against 40% over the shared range (+10 points). Rated 150: MLM
    0 then 2, Relay 1 then 1: 10% each (0). All 20 (24-26 clues): MLM 10% then 30%, Relay 20% then 30%:
    20% against 25% (+5)."""
    def sweep(low: tuple, high: tuple) -> dict:
        out = {}
        for i, (nfe, a, b) in enumerate(((10, *low[0:2]), (20, *high[0:2]))):
            solved = [1] * a + [0] * (10 - a) + [1] * b + [0] * (10 - b)
            out[f"0.{i}"] = {"per_puzzle": per_puzzle([nfe] * 20, solved), "n": 20}
        return out
    write_result(tmp_path, "mlm_s1", "test", "full", 12000, sweep((2, 0), (4, 2)))
    write_result(tmp_path, "relay_s1", "test", "full", 12000, sweep((3, 1), (5, 1)))
    write_result(tmp_path, "mlm_s2", "test", "full", 12000, sweep((9, 9), (9, 9)))  # no Relay seed 2 yet: left out
    found = R.load(str(tmp_path))
    assert R.final_point(found) == 12000
    info = {"test": {"rating": [0] * 10 + [150] * 10, "clues": [25] * 20}}
    rows = {(r["kind"], r["band"]): r for r in R.ladder(found, info, 12000)}
    assert set(rows) == {("rating", "0"), ("rating", "101-200"), ("clues", "24-26")}  # bands under 10 puzzles left out
    for key, mlm, relay in ((("rating", "0"), 0.3, 0.4), (("rating", "101-200"), 0.1, 0.1), (("clues", "24-26"), 0.2, 0.25)):
        assert rows[key]["mlm"] == pytest.approx([mlm]) and rows[key]["relay"] == pytest.approx([relay]), key
        assert rows[key]["budgets"] == pytest.approx([10, 10 + 10 / 3, 10 + 20 / 3, 20])
    # Agresti-Caffo on 10 puzzles: rated 0, 3/10 -> 4/12 and 4/10 -> 5/12,
    # sqrt(4/12 * 8/12 / 12 + 5/12 * 7/12 / 12) = 0.1969; rated 150, 1/10 each: sqrt(2 * 2/12 * 10/12 / 12) = 0.1521
    assert rows["rating", "0"]["se"] == pytest.approx(0.1969, abs=1e-4)
    assert rows["rating", "101-200"]["se"] == pytest.approx(0.1521, abs=1e-4)
    assert R.puzzle_se([0.0], [0.0], 10) == pytest.approx(0.1128, abs=1e-4)  # sqrt(2 * 1/12 * 11/12 / 12), not 0
    # two seeds on the same 10 puzzles: the mean of their s.e., (0.1969 + 0.1521) / 2 (9/10 -> 10/12 is 1/10's
    # mirror), not sqrt(0.1969^2 + 0.1521^2) / 2 = 0.1244 as if each seed had scored other puzzles
    assert R.puzzle_se([0.3, 0.9], [0.4, 0.9], 10) == pytest.approx(0.1745, abs=1e-4)


def test_the_ladder_stays_where_most_seed_pairs_are(tmp_path):
    """Seeds 1-2 at 12,000, seed 1 extended to 24,000, Relay seed 2 at 24,000 without its MLM: the ladder
    stays at 12,000 (two pairs, not one); once MLM seed 2 reaches 24,000 it moves there. Fails with the
    largest compute taken regardless of seeds (checked)."""
    sweep = points((10, 0.2), (20, 0.4))
    for run, eq in (("mlm_s1", 12000), ("relay_s1", 12000), ("mlm_s2", 12000), ("relay_s2", 12000),
                    ("mlm_s1", 24000), ("relay_s1", 24000), ("relay_s2", 24000), ("mlm_s3", 30000)):
        write_result(tmp_path, run, "test", "full", eq, sweep)
    assert R.final_point(R.load(str(tmp_path))) == 12000
    write_result(tmp_path, "mlm_s2", "test", "full", 24000, sweep)
    assert R.final_point(R.load(str(tmp_path))) == 24000


def test_a_seed_trained_past_the_budget_is_shown_alone(tmp_path):
    """Seeds 1-2 to 2,000 (light and full), seed 1 alone on to 4,000. The crossover's means stop at 2,000;
    seed 1 gets its own table with its own values (MLM 30%, Relay 40% at 2,000 over NFE 10-20, not the
    means 25% / 30%), and its 4,000 row is not averaged with the other seeds. Fails with the means taken
    past the ladder's point (checked) and with the seed filter dropped (checked)."""
    for run, (mlm, relay) in (("1", (0.3, 0.4)), ("2", (0.2, 0.2))):
        for protocol in ("light", "full"):
            write_result(tmp_path, f"mlm_s{run}", "test", protocol, 2000, points((10, mlm), (20, mlm)))
            write_result(tmp_path, f"relay_s{run}", "test", protocol, 2000, points((10, relay), (20, relay)))
    write_result(tmp_path, "mlm_s1", "test", "light", 4000, points((10, 0.5), (20, 0.5)))
    write_result(tmp_path, "relay_s1", "test", "light", 4000, points((10, 0.7), (20, 0.7)))
    found = R.load(str(tmp_path))
    assert R.final_point(found) == 2000 and R.extended_seeds(found) == [1]
    means = R.crossover_table(found, {"test": "test"}, upto=R.final_point(found))
    assert "| 2,000 | 10.0-20.0 | 25.0 ± 7.1 | 30.0 ± 14.1 |" in means and "| 4,000 |" not in means
    alone = R.crossover_table(found, {"test": "test"}, seeds={1})
    assert "**test, seed 1 alone**" in alone
    assert "| 2,000 | 10.0-20.0 | 30.0 | 40.0 | 10.0 |" in alone and "| 4,000 | 10.0-20.0 | 50.0 | 70.0 | 20.0 |" in alone


def test_table1_of_a_seed_trained_past_the_budget_is_that_seeds_alone(tmp_path):
    """Seeds 1-2 full at 2,000; seed 1's pair and Relay seed 2 (no MLM partner) full at 4,000: seed 1's
    Table 1 columns come from 4,000 and from seed 1 only (Relay 70%, not the mean with seed 2's 10%).
    Fails without the seed filter (checked)."""
    def full(acc: float) -> dict:
        metrics = {"exact_match": acc, "token_accuracy": acc, "batch1_nfe": 20.0, "legal_rate": acc,
                   "violations_final": 1.0, "violating_snapshots": 2.0, "n": 100}
        return {"0.15": metrics}
    for run, eq, acc in (("mlm_s1", 2000, 0.3), ("relay_s1", 2000, 0.4), ("mlm_s2", 2000, 0.2), ("relay_s2", 2000, 0.2),
                         ("mlm_s1", 4000, 0.5), ("relay_s1", 4000, 0.7), ("relay_s2", 4000, 0.1)):
        write_result(tmp_path, run, "test", "full", eq, full(acc))
    found = R.load(str(tmp_path))
    assert R.final_point(found) == 2000
    assert R.extended_full_point(found, 1) == 4000 and R.extended_full_point(found, 2) is None
    rows = R.table1(found, 4000, {"test": "test"}, seeds={1}).splitlines()[2:]
    assert [row.split(" | ")[1:4] for row in rows] == [["MLM", "1", "50.0"], ["Relay", "1", "70.0"]]


def test_rollout_and_relay_sg_are_compared_with_their_own_seeds_pair(tmp_path):
    """Rollout and Relay (sg) of seed 1 beside MLM and Relay of seed 1 (not seed 2's, 90%), read at the four
    budgets spread over NFE 10-20: on straight lines 0.2 -> 0.4 at 10, 13.3, 16.7, 20 that is 20.0, 26.7,
    33.3, 40.0. Fails with every seed's MLM pooled (checked)."""
    for run, acc in (("mlm_s1", (0.2, 0.4)), ("relay_s1", (0.3, 0.3)), ("mlm_s2", (0.9, 0.9)),
                     ("relay_s2", (0.9, 0.9)), ("rollout_s1", (0.1, 0.1)), ("relay_sg_s1", (0.5, 0.5))):
        write_result(tmp_path, run, "test", "full", 2000, points((10, acc[0]), (20, acc[1])))
    text = "\n".join(R.objectives_compared(R.load(str(tmp_path)), {"test": "test"}))
    assert "## The four objectives, seed 1 (2,000" in text and "seed 2" not in text
    rows = matched_rows(tables_by_set(text)["test"])
    assert rows == {"MLM (1)": [20.0, 26.7, 33.3, 40.0], "Rollout (1)": [10.0] * 4, "Relay (sg) (1)": [50.0] * 4,
                    "Relay (1)": [30.0] * 4}


def test_the_four_objectives_stay_at_the_compute_rollout_and_relay_sg_reached(tmp_path):
    """MLM and Relay trained on to 24,000 after Rollout was evaluated at 12,000: the four objectives are still
    compared at 12,000, with seed 1's MLM and Relay read at 12,000 too (0.2 -> 0.4, not the 90% they reach
    at 24,000). Fails with the comparison made at the latest compute (checked)."""
    for run, eq, acc in (("mlm_s1", 12000, (0.2, 0.4)), ("relay_s1", 12000, (0.3, 0.3)), ("mlm_s1", 24000, (0.9, 0.9)),
                         ("relay_s1", 24000, (0.9, 0.9)), ("rollout_s1", 12000, (0.1, 0.1))):
        write_result(tmp_path, run, "test", "full", eq, points((10, acc[0]), (20, acc[1])))
    text = "\n".join(R.objectives_compared(R.load(str(tmp_path)), {"test": "test"}))
    assert "## The four objectives, seed 1 (12,000" in text and "24,000" not in text
    rows = matched_rows(tables_by_set(text)["test"])
    assert rows == {"MLM (1)": [20.0, 26.7, 33.3, 40.0], "Rollout (1)": [10.0] * 4, "Relay (1)": [30.0] * 4}


def test_driver_arguments_keep_mlm_and_relay_at_the_same_compute():
    args = S.parse_args(["--equivalents=12000", "--keep_every=2000", "--eval_every=1000"])
    assert "--max_iters=12000" in S.train_args("mlm", args) and "--keep_interval=2000" in S.train_args("mlm", args)
    assert "--max_iters=6000" in S.train_args("relay", args) and "--keep_interval=1000" in S.train_args("relay", args)
    assert S.plan([1, 2], ["rollout"]) == [("mlm", 1), ("relay", 1), ("mlm", 2), ("relay", 2), ("rollout", 1)]
    for bad in (["--keep_every=5000", "--equivalents=12000"], ["--keep_every=1999", "--equivalents=3998"]):
        with pytest.raises(SystemExit, match="keep_every"):
            S.parse_args(bad)


@pytest.mark.parametrize("argv, flag", [
    (["--smoke", "--equivalents=0"], "--equivalents"),  # --smoke used to replace it and start building data
    (["--smoke", "--equivalents=-5"], "--equivalents"),
    (["--smoke", "--keep_every=0"], "--keep_every"),
    (["--equivalents=abc"], "--equivalents"),
    (["--lanes=0"], "--lanes"),
    (["--seeds=abc"], "--seeds"),  # used to say "expected comma-separated integers" without naming the flag
    (["--seeds=1,1"], "--seeds"),  # two lanes training one run directory
    (["--seeds=-1"], "--seeds"),  # train_sudoku.py refuses it, after the data was built
    (["--extra=relay"], "--extra"),  # Relay of the first seed planned twice
    (["--extra=foo"], "--extra"),
    (["--device=gpu"], "--device"),
    (["--train_args=--n_layers=2"], "--train_args"),  # a typo train_sudoku.py refuses, after the data was built
    (["--out=FILE"], "--out"),
    (["--runs=FILE/sub"], "--runs"),
    (["--data_dir=FILE"], "--data_dir"),
    (["--figures=FILE"], "--figures"),
    (["--report_only", "--figures=FILE"], "--figures"),
])
def test_bad_flags_stop_the_study_before_any_work(argv, flag, tmp_path, monkeypatch, capsys):
    """Each bad flag: one line naming it, before any data, run or report is made, nothing written.
    Failed on the code before these checks for --smoke with --equivalents/--keep_every, --seeds (all
    three), --extra=relay, --device, --train_args and each folder given as a file (checked)."""
    for name in ("sh", "ensure_data", "train"):
        monkeypatch.setattr(S.runs, name, lambda *a, **k: pytest.fail(f"{argv}: work started"))
    monkeypatch.chdir(ROOT)
    afile = tmp_path / "afile"
    afile.write_text("keep")
    argv = [a.replace("FILE", str(afile)) for a in argv]
    where = {f"--{k}": str(tmp_path / k) for k in ("runs", "out", "data_dir")}
    argv += [f"{k}={v}" for k, v in where.items() if not any(a.startswith(k + "=") for a in argv)]
    with pytest.raises(SystemExit) as e:
        S.main(argv)
    message = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in message and "\n" not in message, message
    assert os.listdir(tmp_path) == ["afile"] and afile.read_text() == "keep"


def test_a_seed_extended_past_the_budget_is_evaluated_not_retrained(tmp_path, monkeypatch):
    """After `--equivalents=24000 --seeds=1` extended seed 1, the default 12,000 study must read that run's
    kept weights and go on to the other runs; it used to stop on the differing --max_iters. Through the
    real runs.train (train_sudoku.py stubbed): a finished run with a smaller budget is still extended, an
    unfinished longer one resumed, and one differing in anything else still stops the lane in one line. Fails without longer_ok (checked)."""
    import queue
    trained, evaluated, failures = [], [], []
    monkeypatch.setattr(S.runs, "sh", lambda cmd, log=None, echo=True: trained.append(os.path.basename(os.path.dirname(log))))
    monkeypatch.setattr(S, "evaluate", lambda run_dir, objective, step, protocol, args:
                        evaluated.append((os.path.basename(run_dir), step, protocol)))
    args = S.parse_args([f"--runs={tmp_path}", "--equivalents=12000"])

    def finished(name: str, objective: str, cmd_args: list[str], seed: int = 1, marker: str = "DONE.json") -> None:
        run_dir = os.path.join(str(tmp_path), name)
        os.makedirs(os.path.join(run_dir, "kept"))
        for step in (3000, 6000, 12000):
            open(os.path.join(run_dir, "kept", f"step_{step}.safetensors"), "w").close()
        cmd = S.runs.train_command(objective, run_dir, seed, cmd_args)[1:]
        S.runs.write_marker(os.path.join(run_dir, marker), {"cmd": cmd})

    relay = S.train_args("relay", args)
    finished("relay_s1", "relay", [a.replace("--max_iters=6000", "--max_iters=12000") for a in relay])
    finished("mlm_s1", "mlm", [a.replace("--max_iters=12000", "--max_iters=6000") for a in S.train_args("mlm", args)])
    finished("relay_s2", "relay", [a.replace("--max_iters=6000", "--max_iters=12000") for a in relay]
             + ["--learning_rate=3e-4"], seed=2)
    # killed on its way to 12,000 steps: not past this budget yet, so it is resumed (to it), not read
    finished("relay_s3", "relay", [a.replace("--max_iters=6000", "--max_iters=12000") for a in relay], seed=3,
             marker="STARTED.json")
    todo = queue.Queue()
    for item in [("relay", 1), ("mlm", 1), ("relay", 3), ("relay", 2)]:
        todo.put(item)
    S.lane(1, todo, args, failures)
    assert trained == ["mlm_s1", "relay_s3"]
    assert [e for e in evaluated if e[0] == "relay_s1"] == [("relay_s1", 3000, "light"), ("relay_s1", 6000, "light"),
                                                            ("relay_s1", 12000, "light"), ("relay_s1", 6000, "full")]
    assert len(failures) == 1 and failures[0].startswith("relay_s2:") and "(--learning_rate: 3e-4 -> None; --max_iters: 12000 -> 6000)" in failures[0]



def test_an_exception_in_a_lane_stops_it_in_one_line_naming_the_run(tmp_path, monkeypatch):
    """An evaluation raising something other than SystemExit (here a RuntimeError) is recorded as the lane's failure,
    one line naming the run, and the lane takes no further run. Bug checked: lane() catching only SystemExit (the
    exception ended the thread alone, and the study exited 0 without the lane's later runs)."""
    import queue
    trained = []
    monkeypatch.setattr(S.runs, "train", lambda objective, run_dir, *a, **k: trained.append(os.path.basename(run_dir)))
    monkeypatch.setattr(S, "kept_steps", lambda run_dir: [100])

    def evaluate(*a) -> None:
        raise RuntimeError("the results folder went away\nsecond line")
    monkeypatch.setattr(S, "evaluate", evaluate)
    todo, failures = queue.Queue(), []
    for item in [("mlm", 1), ("relay", 1)]:
        todo.put(item)
    S.lane(1, todo, S.parse_args([f"--runs={tmp_path}"]), failures)
    assert failures == ["mlm_s1: RuntimeError: the results folder went away"] and trained == ["mlm_s1"]

def test_kept_steps_lists_only_kept_weight_files(tmp_path):
    (tmp_path / "kept").mkdir()
    for name in ("step_2000.safetensors", "step_400.safetensors", "step_9.safetensors.tmp", "notes.txt"):
        (tmp_path / "kept" / name).write_text("")
    assert S.kept_steps(str(tmp_path)) == [400, 2000]
    assert S.kept_steps(str(tmp_path / "missing")) == []
    assert np.isnan(R.mean_sd([0.5])[1])


def test_prebuilt_data_is_never_rebuilt(tmp_path, monkeypatch):
    """On a machine without larsdoku, building would give other hard puzzles and no Top1465 (the GPU check
    carries the data instead): --prebuilt stops in one line rather than build."""
    monkeypatch.setattr(S.runs, "ensure_data", lambda *a: pytest.fail("tried to build the data"))
    args = S.parse_args(["--prebuilt", f"--data_dir={tmp_path}/missing", f"--runs={tmp_path}/runs"])
    with pytest.raises(SystemExit, match="--prebuilt: .* holds no stand-in data"):
        S.run_all(args)


# -----------------------------------------------------------------------------
# the kept results, their report and the README agree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEPT = os.path.join(ROOT, "results", "standin_study")
RERUN = os.path.join(ROOT, "results", "standin_rerun")  # seed 2 retrained on another CPU (docs/results.md)
RESULTS_PAGE = os.path.join(ROOT, "docs", "results.md")  # where the README's tables of the study moved


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+(?:\.\d+)?", text.replace("−", "-").replace(",", ""))]


def table_rows(text: str, header_start: str) -> list[list[str]]:
    """The cells of each row of the first Markdown table whose header starts with header_start."""
    lines = [line.strip() for line in text.splitlines()]  # a table inside a list item is indented
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def tables_by_set(text: str) -> dict[str, str]:
    """The text after each "**<set title>**: exact match" heading, by set title."""
    parts = re.split(r"\n\*\*(.+?)\*\*: exact match", text)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def report_sections(md: str) -> dict[str, str]:
    """The report's crossover tables by set title (the four objectives' matched tables further down carry the
    same set titles, so the split stops at the ladder)."""
    return tables_by_set(md.split("\n## Difficulty ladder")[0])


def matched_rows(table: str) -> dict[str, list[float]]:
    """{objective: exact match at each NFE budget} of one four-objective matched-NFE table."""
    return {cells[0]: [numbers(c)[0] for c in cells[1:]] for cells in table_rows(table, "| objective")}


@pytest.mark.parametrize("kept", [KEPT, RERUN], ids=["study", "rerun"])
def test_the_kept_report_is_what_the_kept_results_give(tmp_path, kept):
    """standin_study.md redrawn from the committed JSONs (into a copy): the same text, so a result added
    without `--report_only` shows. Fails with one kept JSON's accuracy changed (checked, in each folder)."""
    out = tmp_path / "standin_study"
    shutil.copytree(kept, out)
    R.report(str(out), str(tmp_path / "figures"), str(tmp_path / "no_data"))  # puzzles.json stands in for the data
    assert (out / "standin_study.md").read_text() == open(os.path.join(kept, "standin_study.md")).read()


def test_the_rerun_on_another_cpu_is_shown_as_kept():
    """docs/results.md's table of seed 2 trained on two CPUs carries τ = 0.15 exact match / NFE of both kept
    JSON sets, in the order MLM then Relay, study (AMD) then rerun (Intel). Fails with one cell changed or
    the two folders swapped (checked)."""
    shown = table_rows(open(RESULTS_PAGE).read(), "| puzzles | MLM, AMD EPYC")
    assert [cells[0] for cells in shown] == ["Top1465 (200)", "test (400)", "test hard cohort (130)"]
    for cells, set_name in zip(shown, ("Top1465", "test", "test hard cohort")):
        expected = []
        for run in ("mlm_s2", "relay_s2"):
            for folder in (KEPT, RERUN):
                with open(P.result_path(folder, run, set_name, "light", 2000)) as f:
                    m = json.load(f)["checkpoints"][0]["results"]["all"]["0.15"]
                expected.append(f"{100 * m['exact_match']:.1f}% / {m['batch1_nfe']:.1f}")
        assert cells[1:] == expected, set_name


def report_crossover(md: str) -> dict[tuple[int, str], list[float]]:
    """{(compute, table title): [MLM, Relay, Relay − MLM, s.e.]} from the report's crossover tables."""
    sections, report = report_sections(md), {}
    for title in sections:
        for cells in table_rows(sections[title], "| compute"):
            report[(int(cells[0].replace(",", "")), title)] = [numbers(c)[0] for c in cells[2:6]]
    return report


def test_readme_shows_the_kept_report():
    """The README's crossover table carries the report's numbers (means over seeds), so the README cannot
    lag behind a seed added to the study. Fails with one README cell changed (checked)."""
    report = report_crossover(open(os.path.join(KEPT, "standin_study.md")).read())
    shown = table_rows(open(os.path.join(ROOT, "README.md")).read(),
                       "| compute (MLM-step equivalents) | Top1465: MLM / Relay")
    assert len(shown) >= 3
    for cells in shown:
        eq = int(cells[0].replace(",", ""))
        for title, cell in zip(("Top1465", "test", "test hard cohort"), cells[1:]):
            assert tuple(numbers(cell)) == tuple(report[(eq, title)][:2]), (eq, title, cell)


def test_results_page_shows_seed_1_past_the_budget_and_the_ladder():
    """docs/results.md's table of seed 1 trained on to 24,000 (MLM / Relay / Relay − MLM ± s.e. per set) and
    its ladder row carry the report's numbers. Fails with one cell of either changed (checked)."""
    md = open(os.path.join(KEPT, "standin_study.md")).read()
    page = open(RESULTS_PAGE).read()
    report = report_crossover(md)
    if "Top1465, seed 1 alone" not in report_sections(md):
        pytest.skip("seed 1 not trained past the study's budget")
    shown = table_rows(page, "| compute (MLM-step equivalents) | Top1465 (200): MLM / Relay / Relay − MLM")
    assert len(shown) >= 3
    for cells in shown:
        eq = int(cells[0].replace(",", ""))
        for title, cell in zip(("Top1465", "test", "test hard cohort"), cells[1:]):
            assert numbers(cell) == report[(eq, title + ", seed 1 alone")], (eq, title, cell)
    ladder = {cells[0]: (numbers(cells[5])[0], numbers(cells[6])[0])
              for cells in table_rows(md, "| band | puzzles") if cells[0].startswith("rating")}
    header = table_rows(page, "| rating band (backtracks)")
    bands = [c for c in page.split("| rating band (backtracks) |")[1].splitlines()[0].split("|") if c.strip()]
    diff_row = next(cells for cells in header if cells[0].startswith("Relay − MLM"))
    assert len(bands) == len(diff_row) - 1 == 6
    for band, cell in zip(bands, diff_row[1:]):
        assert tuple(numbers(cell)) == ladder[f"rating {band.strip()}"], (band, cell)


def test_results_page_shows_the_reports_four_objectives():
    """docs/results.md's four-objective table (seed 1) gives, per objective and set, the report's exact match
    at the four matched NFE budgets, then the row's largest s.e. Fails with one cell changed (checked)."""
    md = open(os.path.join(KEPT, "standin_study.md")).read()
    section = md.split("\n## The four objectives, seed 1 ")[1]
    report = {(title, objective.removesuffix(" (1)")): accuracies
              for title, table in tables_by_set(section).items()
              for objective, accuracies in matched_rows(table).items()}
    shown = table_rows(open(RESULTS_PAGE).read(), "| objective | Top1465 (500), NFE")
    assert [cells[0] for cells in shown] == ["MLM", "Rollout", "Relay (sg)", "Relay"]
    for cells in shown:
        for title, cell in zip(("Top1465", "test", "test hard cohort"), cells[1:]):
            assert numbers(cell)[:4] == report[(title, cells[0])], (title, cells[0], cell)
