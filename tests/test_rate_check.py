"""Table 2 in miniature v2's rate check (scripts/table2/rate_check.py): its paired differences by hand, its refusal
without the pilot's runs, and that kept decodings are read rather than decoded again."""
import argparse
import json
import os
import re

import pytest

from scripts.table2 import rate_check

IDS = ["mini2/test/0", "mini2/test/1"]
NFE = {"sft_s1_lr0.0003": [40, 50], "sft_s1_lr0.001": [30, 36], "relay_s1_lr0.0003": [42, 54],
       "relay_s1_lr0.001": [31, 41], "relay_s1_lr0.0003_nocarry": [42, 52]}


def record(name: str) -> dict:
    return rate_check.store.stamp(dict(model=name, step=300, tau=0.85, protocol="test", task_ids=IDS, base=[1, 0],
                                             plus=[1, 0], nfe=NFE[name]))


def test_the_differences_are_relay_minus_sft_task_by_task():
    """By hand: at 3e-4 the per-task differences are 2 and 4 (mean 3, s.d. 1.414, s.e. 1.0); at 1e-3, 1 and 5 (3, 2.0);
    the chosen pair (Relay 3e-4 against SFT 1e-3) 12 and 18 (15, 3.0); the carry 0 and 2 (1, 1.0). Fails with the
    pair read the wrong way round (-3.0) or the runs' labels crossed."""
    text = rate_check.table({name: record(name) for name in NFE}, argparse.Namespace(n=2, tau=0.85))
    for line in ("Relay - SFT at 0.0003: +3.0 (s.e. 1.0)", "Relay - SFT at 0.001: +3.0 (s.e. 2.0)",
                 "the chosen runs (Relay at 0.0003, SFT at 0.001): +15.0 (s.e. 3.0)",
                 "Relay at 0.0003, with its carry - without: +1.0 (s.e. 1.0)",
                 "| relay_s1_lr0.001 | 0.001 | yes | 50.0 | 50.0 | 36.0 |"):
        assert line in text, line


def test_without_the_pilot_s_runs_it_stops_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        rate_check.parse_args([f"--runs={tmp_path}"])
    message = str(e.value)
    assert "\n" not in message and "missing" in message and "study.py --study=v2" in message


def test_kept_decodings_are_read_not_decoded_again(tmp_path, monkeypatch):
    """Every decoding kept in --out: eval_code.py is not called (a killed check resumes where it stopped)."""
    for name in NFE:
        (tmp_path / f"{name}_n2_tau_0.85.json").write_text(json.dumps(record(name)))

    def refuse(argv):
        raise AssertionError(f"decoded again: {argv}")
    monkeypatch.setattr(rate_check.mini_check.eval_code, "main", refuse)
    for objective, lr, _ in rate_check.DECODINGS:
        os.makedirs(rate_check.checkpoint(str(tmp_path / "runs"), objective, lr), exist_ok=True)
    records = rate_check.decode(rate_check.parse_args([f"--runs={tmp_path / 'runs'}", f"--out={tmp_path}", "--n=2"]))
    assert {name: r["nfe"] for name, r in records.items()} == NFE


def test_the_docs_state_the_kept_rate_check():
    """docs/table2_miniature.md's rate-check rows and paired differences are what the kept JSONs in
    results/mini_study_v2_rates/ give. Fails with a number in the page edited."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kept = os.path.join(root, "results", "mini_study_v2_rates")
    args = argparse.Namespace(n=100, tau=0.85, out=kept)
    names = [rate_check.label(*d) for d in rate_check.DECODINGS]
    records = {name: rate_check.read_kept(rate_check.kept_path(args, name), name, args) for name in names}
    page = open(os.path.join(root, "docs", "table2_miniature.md"), encoding="utf-8").read()
    text = rate_check.table(records, args)
    for row in [line for line in text.splitlines() if line.startswith("| sft_") or line.startswith("| relay_")]:
        assert row in page, row
    # the prose quotes each paired difference: "+5.4 NFE at 3e-4 and +7.9 at 1e-3 (per-task s.e. 0.9 and 0.7)"
    for diff, se in re.findall(r": ([+-][\d.]+) \(s\.e\. ([\d.]+)\)", text):
        assert diff in page and se in page, (diff, se)


def test_a_new_decoding_is_kept_with_the_device_it_ran_on(tmp_path, monkeypatch):
    """The kept JSON names the device (the study's reports say where each result was decoded); eval_code.py's
    out_dir is stood in for by its three files. Fails with `device` dropped from the kept record."""
    def fake_decode(model, data, tau, carry, out, max_new_tokens, sandbox, who):
        os.makedirs(out)
        summary = {key: 50.0 for key in rate_check.store.RESULT_KEYS}
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(summary, f)
        with open(os.path.join(out, "samples.jsonl"), "w") as f:
            f.writelines(json.dumps({"task_id": t, "nfe": 40}) + "\n" for t in IDS)
        with open(os.path.join(out, "judged.jsonl"), "w") as f:
            f.writelines(json.dumps({"task_id": t, "base": True, "plus_inputs": i == 0}) + "\n" for i, t in enumerate(IDS))
        return out
    monkeypatch.setattr(rate_check.mini_check, "decode_model", fake_decode)
    monkeypatch.setattr(rate_check.mini_check, "v2_tasks", lambda n: [{"task_id": t} for t in IDS[:n]])
    for objective, lr, _ in rate_check.DECODINGS:
        os.makedirs(rate_check.checkpoint(str(tmp_path / "runs"), objective, lr), exist_ok=True)
        open(os.path.join(rate_check.checkpoint(str(tmp_path / "runs"), objective, lr), "manifest.json"), "w").write("{}")
    args = rate_check.parse_args([f"--runs={tmp_path / 'runs'}", f"--out={tmp_path / 'kept'}", "--n=2"])
    rate_check.decode(args)
    for d in rate_check.DECODINGS:
        kept = rate_check.read_kept(rate_check.kept_path(args, rate_check.label(*d)), rate_check.label(*d), args)
        assert kept["device"] == "cpu" and kept["plus"] == [1, 0] and kept["nfe"] == [40, 40]


def test_every_kept_rate_check_result_names_its_device():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kept = os.path.join(root, "results", "mini_study_v2_rates")
    for name in sorted(os.listdir(kept)):
        assert rate_check.store.read_kept(os.path.join(kept, name), named_by_fields=False).get("device") == "cpu", name
