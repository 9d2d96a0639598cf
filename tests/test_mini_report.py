"""Table 2 in miniature, the report (scripts/table2/mini_report.py): matched NFE, paired standard errors, the table, against
values worked out by hand."""
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "table2"))
import mini_report as R  # noqa: E402

IDS = ["mini/heldout/0", "mini/heldout/1", "mini/seen/0", "mini/seen/1"]


def result(model: str, tau: float, plus: list[int], nfe: list[float], base: list[int] | None = None, step: int = 200,
           protocol: str = "full") -> dict:
    return dict(model=model, step=step, tau=tau, protocol=protocol, task_ids=IDS, plus=plus, base=base or plus, nfe=nfe)


def test_compact_keeps_the_authors_plus_rule_and_the_nfe_per_task(tmp_path):
    ev = tmp_path / "eval"
    ev.mkdir()
    (ev / "results.json").write_text(json.dumps(dict(pass1_base=50.0, pass1_plus_authors=50.0, pass1_plus_evalplus=25.0,
                                                     mean_nfe=7.5)))
    order = [IDS[3], IDS[0], IDS[2], IDS[1]]  # written in decoding order, kept in task order
    (ev / "samples.jsonl").write_text("".join(json.dumps(dict(task_id=t, nfe=n)) + "\n" for t, n in zip(order, (4, 5, 6, 15))))
    verdicts = {IDS[0]: (True, True), IDS[1]: (False, True), IDS[2]: (True, False), IDS[3]: (False, False)}
    (ev / "judged.jsonl").write_text("".join(json.dumps(dict(task_id=t, base=b, plus_inputs=p, plus=b and p)) + "\n"
                                             for t, (b, p) in verdicts.items()))
    r = R.compact(str(ev), str(tmp_path / "kept" / "x.json"), dict(model="sft_s1"))
    assert r["task_ids"] == IDS and r["nfe"] == [5, 15, 6, 4]
    assert r["base"] == [1, 0, 1, 0] and r["plus"] == [1, 1, 0, 0]  # plus inputs alone, whatever base gave
    assert json.loads((tmp_path / "kept" / "x.json").read_text()) == r


def test_scores_at_a_matched_nfe_interpolate_each_task_like_the_curve():
    # held-out tasks: tau 0.5 -> NFE 4 and 6 (mean 5), pass [0, 1]; tau 0.9 -> NFE 10 and 12 (mean 11), pass [1, 1]
    curve = [result("m", 0.5, [0, 1, 0, 0], [4, 6, 9, 9]), result("m", 0.9, [1, 1, 0, 0], [10, 12, 9, 9])]
    assert R.at_nfe(curve, "heldout", 7.0) == pytest.approx([1 / 3, 1.0])  # 7 is a third of the way from 5 to 11
    assert R.at_nfe(curve, "heldout", 4.9) is None and R.at_nfe(curve, "heldout", 11.1) is None  # never extrapolated
    assert R.at_nfe(curve, "heldout", 11.0) == pytest.approx([1.0, 1.0])


def test_paired_differences_average_each_task_over_seeds_first():
    pairs = [([0, 0, 1, 1], [1, 0, 1, 1]), ([0, 1, 1, 0], [1, 1, 1, 1])]
    # per seed: [1, 0, 0, 0] and [1, 0, 0, 1]; per task over seeds: [1, 0, 0, 0.5]
    d, se, spread = R.paired(pairs)
    assert d == pytest.approx(0.375)
    task_sd = math.sqrt(((0.625 ** 2) + 2 * (0.375 ** 2) + (0.125 ** 2)) / 3)
    assert se == pytest.approx(task_sd / 2)
    assert spread == pytest.approx(math.sqrt(2 * 0.125 ** 2))  # seed means 0.25 and 0.5


def test_table2_gives_mean_and_sd_over_seeds_at_tau_0_85():
    found = R.curves([result("sft_s1", 0.85, [1, 0, 1, 1], [10, 20, 30, 30]), result("sft_s2", 0.85, [1, 1, 0, 1], [20, 20, 30, 50]),
                      result("sft_s1", 0.5, [0, 0, 0, 0], [1, 1, 1, 1]), result("base", 0.85, [0, 0, 1, 0], [8, 8, 8, 8], step=0)],
                     "full")
    rows = R.table2(found)
    base = next(r for r in rows if r.startswith("| Fast-dLLM v2"))
    assert base == "| Fast-dLLM v2 (stage B) | 1 | 0.0 | 0.0 | 8.0 | 50.0 | 50.0 | 8.0 |"
    sft = next(r for r in rows if r.startswith("| Vanilla SFT"))
    # held-out: pass 50 and 100 (mean 75, s.d. 35.4), NFE 15 and 20; seen: pass 100 and 50, NFE 30 and 40
    assert sft == "| Vanilla SFT | 2 | 75.0 ± 35.4 | 75.0 ± 35.4 | 17.5 ± 3.5 | 75.0 ± 35.4 | 75.0 ± 35.4 | 35.0 ± 7.1 |"


def test_nfe_at_a_matched_pass_rate_reads_the_curve_sideways():
    curve = [result("m", 0.5, [0, 0, 1, 0], [2, 2, 5, 5]), result("m", 0.9, [0, 0, 1, 1], [2, 2, 9, 11])]
    # seen split: pass 50% at NFE 5 and 5, 100% at NFE 9 and 11; 60% is a fifth of the way
    assert R.nfe_at_pass(curve, "seen", 60.0) == pytest.approx([5.8, 6.2])
    assert R.nfe_at_pass(curve, "seen", 40.0) is None


def test_nfe_at_matched_pass_is_paired_per_task():
    """Seen split, hand-worked. SFT: 50% at NFE [4, 6], 100% at [8, 10]. Relay: 0% at [3, 3], 100% at [5, 7].
    Both reach 50-100%, so the levels are 50, 75 and 100. At 75% SFT is half-way ([6, 8]) and Relay three quarters
    of the way ([4.5, 6]): per-task differences [-1.5, -2], mean -1.75, s.e. 0.25. Fails when each level's NFE is
    not taken per task (no s.e.) or weighted otherwise."""
    found = R.curves([result("sft_s1", 0.5, [1, 1, 0, 1], [1, 1, 4, 6]), result("sft_s1", 0.9, [1, 1, 1, 1], [1, 1, 8, 10]),
                      result("relay_s1", 0.5, [1, 1, 0, 0], [1, 1, 3, 3]), result("relay_s1", 0.9, [1, 1, 1, 1], [1, 1, 5, 7])],
                     "full")
    lines = R.nfe_at_matched_pass(found)
    seen = lines[lines.index("**seen compositions:**"):]
    rows = [[float(c.replace("+", "")) if c != "-" else None for c in line.strip("| ").split(" | ")]
            for line in seen if line.startswith("| ") and line[2].isdigit()]
    expected = [[50.0, 5.0, 4.5, -0.5, 0.5, None],  # Relay half-way from 0% to 100%: [4, 5]; SFT [4, 6]
                [75.0, 7.0, 5.25, -1.75, 0.25, None],
                [100.0, 9.0, 6.0, -3.0, 0.0, None]]
    assert len(rows) == 3
    for row, want in zip(rows, expected):
        assert row[:5] == pytest.approx(want[:5], abs=0.051) and row[5] is want[5]


def test_training_cost_is_the_median_logged_throughput_against_the_same_seeds_sft(tmp_path):
    """Hand-worked: SFT seed 1 logs 900, 1000, 1300 tokens/s (median 1000); Relay seed 1 logs 400, 600, 700, 2000
    (median of an even count: 650, so 0.65 of SFT); Relay seed 2 has no SFT of its seed. Fails with the mean
    instead of the median (relay 925, checked) or with the ratio taken against another seed's SFT."""
    logs = {"sft_s1": [900, 1300, 1000], "relay_s1": [600, 400, 2000, 700], "relay_s2": [500], "base": [1]}
    for model, speeds in logs.items():
        (tmp_path / model).mkdir()
        (tmp_path / model / "train_metrics.jsonl").write_text(
            "".join(json.dumps(dict(step=10 * (i + 1), loss=1.0, tokens_per_s=v)) + "\n" for i, v in enumerate(speeds)))
    rows = R.training_cost(str(tmp_path))[2:]
    assert rows == ["| relay_s1 | 40 | 650 | 0.65 |", "| relay_s2 | 10 | 500 | - |", "| sft_s1 | 30 | 1000 | 1.00 |"]


def test_the_docs_state_v1_s_kept_results():
    """docs/table2_miniature.md's v1 rows (held-out compositions, tau 0.85, each model's last step, mean +- s.d.
    over the seeds kept) are what the kept JSONs in results/mini_study/ give. Fails with a number edited in the
    page, or when a seed is kept but the page not updated (checked: a second seed's copy of relay_s1)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    page = open(os.path.join(root, "docs", "table2_miniature.md"), encoding="utf-8").read()
    found = R.curves(R.load(os.path.join(root, "results", "mini_study")), "full")
    for method in ("base", "sft", "relay"):
        models = sorted({m for m, _ in found if R.method_of(m) == method})
        chosen = [R.at_tau(found[(m, max(s for mm, s in found if mm == m))], R.TABLE_TAU) for m in models]
        assert chosen and all(chosen), method
        row = (f"| {R.METHODS[method]} | {len(chosen)} | {R.fmt([R.rate(r, 'heldout', 'base') for r in chosen])} / "
               f"{R.fmt([R.rate(r, 'heldout') for r in chosen])} | {R.fmt([R.mean(R.select(r, 'heldout', 'nfe')) for r in chosen])} |")
        assert row in page, f"docs/table2_miniature.md lacks the row {row}"
