"""Table 2 in miniature: a decoding compacted into its kept JSON (scripts/table2/store.py), and the report's matched NFE
and paired standard errors (scripts/table2/mini_report_v2.py), against values worked out by hand; v1's rows in the
docs against its kept results."""
import json
import math
import os

import pytest

from scripts.table2 import mini_report_v2 as R, store  # noqa: E402

IDS = ["mini/heldout/0", "mini/heldout/1", "mini/seen/0", "mini/seen/1"]


def result(model: str, tau: float, plus: list[int], nfe: list[float], base: list[int] | None = None, step: int = 200,
           protocol: str = "full") -> dict:
    return dict(model=model, step=step, tau=tau, protocol=protocol, task_ids=IDS, plus=plus, base=base or plus, nfe=nfe)


def test_compact_keeps_the_authors_plus_rule_and_the_nfe_per_task(tmp_path):
    ev = tmp_path / "eval"
    ev.mkdir()
    (ev / "results.json").write_text(json.dumps(dict(pass1_base=50.0, pass1_plus_authors=50.0, pass1_plus_evalplus=25.0,
                                                     mean_nfe=7.5, sandbox="bwrap")))
    order = [IDS[3], IDS[0], IDS[2], IDS[1]]  # written in decoding order, kept in task order
    (ev / "samples.jsonl").write_text("".join(json.dumps(dict(task_id=t, nfe=n)) + "\n" for t, n in zip(order, (4, 5, 6, 15))))
    verdicts = {IDS[0]: (True, True), IDS[1]: (False, True), IDS[2]: (True, False), IDS[3]: (False, False)}
    (ev / "judged.jsonl").write_text("".join(json.dumps(dict(task_id=t, base=b, plus_inputs=p, plus=b and p)) + "\n"
                                             for t, (b, p) in verdicts.items()))
    r = store.compact(str(ev), str(tmp_path / "kept" / "x.json"), dict(model="sft_s1"))
    assert r["task_ids"] == IDS and r["nfe"] == [5, 15, 6, 4]
    assert r["base"] == [1, 0, 1, 0] and r["plus"] == [1, 1, 0, 0]  # plus inputs alone, whatever base gave
    assert r["sandbox"] == "bwrap"  # how the programs were isolated (a GPU loan may have had no sandbox)
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


def test_the_docs_state_v1_s_kept_results():
    """docs/table2_miniature.md's v1 rows (held-out compositions, tau 0.85, each model's last step, mean +- s.d.
    over the seeds kept) are what the kept JSONs in results/mini_study/ give. Fails with a number edited in the
    page, or when a seed is kept but the page not updated (checked: a second seed's copy of relay_s1)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    page = open(os.path.join(root, "docs", "table2_miniature.md"), encoding="utf-8").read()
    found = R.curves(store.load(os.path.join(root, "results", "mini_study")), "full")
    for method in ("base", "sft", "relay"):
        models = sorted({m for m, _ in found if R.method_of(m) == method})
        chosen = [next((r for r in found[(m, max(s for mm, s in found if mm == m))] if r["tau"] == 0.85), None)
                  for m in models]
        assert chosen and all(chosen), method
        row = (f"| {R.METHODS[method]} | {len(chosen)} | {R.fmt([R.rate(r, 'heldout', 'base') for r in chosen])} / "
               f"{R.fmt([R.rate(r, 'heldout') for r in chosen])} | {R.fmt([R.mean(R.select(r, 'heldout', 'nfe')) for r in chosen])} |")
        assert row in page, f"docs/table2_miniature.md lacks the row {row}"
