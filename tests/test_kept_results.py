"""Kept results of Table 2 in miniature cannot be swapped, cut or edited unnoticed: each case below damages a copy
of the kept v2 results the way a copy between machines or a hand edit would, and the reader (the v2 report, which
`study.py --study=v2 --report_only` runs, and rate_check.py's reader) must stop in one line naming the file and the
field, writing nothing."""
import argparse
import json
import os
import shutil

import pytest

from scripts.table2 import mini_report_v2, rate_check, store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V2 = os.path.join(ROOT, "results", "mini_study_v2")
RATES = os.path.join(ROOT, "results", "mini_study_v2_rates")
TEST = "step_300_test_tau_0.85.json"


def read(path):
    with open(path) as f:
        return json.load(f)


def write(path, record):
    with open(path, "w") as f:
        json.dump(record, f)


def edit(path, restamp=False, **fields):
    record = dict(read(path), **fields)
    write(path, store.stamp({k: v for k, v in record.items() if k != "digest"}) if restamp else record)


def cut(path, n, restamp=False):
    record = read(path)
    edit(path, restamp, **{k: record[k][:n] for k in store.PER_TASK + ("task_ids",) if k in record},
         **({"n": n} if "n" in record else {}))


def renamed_folder(out, edit_models):
    shutil.rmtree(os.path.join(out, "relay_s3"))
    os.rename(os.path.join(out, "relay_s2"), os.path.join(out, "relay_s3"))
    for name in os.listdir(os.path.join(out, "relay_s3")) if edit_models else []:
        if name.startswith("step_"):
            edit(os.path.join(out, "relay_s3", name), model="relay_s3")


# (case, what it does to the copy, the field the refusal must name)
CASES = {
    "another seed's file renamed into place": (lambda out: shutil.copy(os.path.join(out, "relay_s2", TEST), os.path.join(out, "relay_s3", TEST)), "model:"),
    "... with its model field edited": (lambda out: (shutil.copy(os.path.join(out, "relay_s2", TEST), os.path.join(out, "relay_s3", TEST)),
                                                     edit(os.path.join(out, "relay_s3", TEST), model="relay_s3")), "digest:"),
    "another seed's folder renamed into place": (lambda out: renamed_folder(out, False), "model:"),
    "... with its model fields edited": (lambda out: renamed_folder(out, True), "digest:"),
    "a tau 0.7 result under the tau 0.85 name": (lambda out: shutil.copy(os.path.join(out, "sft_s1", "step_300_test_tau_0.7.json"),
                                                                         os.path.join(out, "sft_s1", TEST)), "step/protocol/tau:"),
    "a reworded result under the test name": (lambda out: shutil.copy(os.path.join(out, "sft_s1", "step_300_reworded_tau_0.85.json"),
                                                                      os.path.join(out, "sft_s1", TEST)), "step/protocol/tau:"),
    "one seed's file cut to 100 tasks": (lambda out: cut(os.path.join(out, "sft_s4", TEST), 100), "digest:"),
    "... and stamped again": (lambda out: cut(os.path.join(out, "sft_s4", TEST), 100, restamp=True), "task_ids:"),
    "an NFE list edited by -15 per task": (lambda out: edit(os.path.join(out, "relay_s5", TEST),
                                                            nfe=[v - 15 for v in read(os.path.join(out, "relay_s5", TEST))["nfe"]]), "digest:"),
    "a result of other data, stamped again": (lambda out: edit(os.path.join(out, "sft_s2", TEST), restamp=True, data_sha256="0" * 64),
                                              "data_sha256:"),
    "a result without its stamp": (lambda out: write(os.path.join(out, "sft_s2", TEST),
                                                     {k: v for k, v in read(os.path.join(out, "sft_s2", TEST)).items() if k != "digest"}),
                                   "digest: missing"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_refuses_a_swapped_or_edited_result(tmp_path, case):
    """Bugs checked (each made once): the name not compared with the fields, the digest not checked, the task count
    not checked, the data pins not compared, unstamped results accepted: each lets its cases through."""
    out = str(tmp_path / "mini_study_v2")
    shutil.copytree(V2, out)
    damage, field = CASES[case]
    damage(out)
    report = os.path.join(out, "mini_study_v2.md")
    before = open(report).read()
    with pytest.raises(SystemExit) as e:
        mini_report_v2.main([out])
    message = str(e.value)
    assert "\n" not in message and field in message and out in message, message
    assert open(report).read() == before  # nothing written


RATE_CASES = {
    "another run's decoding under a rate-pilot name": (lambda d: shutil.copy(os.path.join(d, "relay_s1_lr0.001_n100_tau_0.85.json"),
                                                                              os.path.join(d, "sft_s1_lr0.001_n100_tau_0.85.json")), "model:"),
    "a result for 50 tasks under the n100 name": (lambda d: cut(os.path.join(d, "sft_s1_lr0.001_n100_tau_0.85.json"), 50, restamp=True),
                                                  "task_ids:"),
}


@pytest.mark.parametrize("case", sorted(RATE_CASES))
def test_the_rate_check_refuses_a_swapped_result(tmp_path, case):
    shutil.copytree(RATES, tmp_path / "rates")
    damage, field = RATE_CASES[case]
    damage(str(tmp_path / "rates"))
    args = argparse.Namespace(n=100, tau=0.85, out=str(tmp_path / "rates"))
    with pytest.raises(SystemExit) as e:
        for d in rate_check.DECODINGS:
            rate_check.read_kept(rate_check.kept_path(args, rate_check.label(*d)), rate_check.label(*d), args)
    assert "\n" not in str(e.value) and field in str(e.value), str(e.value)


def test_the_kept_results_pass_every_check():
    """The committed results as they are: every reader takes them (the cases above start from them)."""
    assert len(mini_report_v2.kept(V2)) == 62
    args = argparse.Namespace(n=100, tau=0.85, out=RATES)
    assert all(rate_check.read_kept(rate_check.kept_path(args, rate_check.label(*d)), rate_check.label(*d), args)
               for d in rate_check.DECODINGS)
