"""Any damaged file a reader of Table 2 in miniature opens (kept results and training logs, the data's build.json
and pins, kept checkpoints in a study's keep step) stops it with one line naming the file and the field, and with
nothing written: never a traceback, never a silently wrong number. One table, one case per damage."""
import argparse
import json
import os
import shutil

import pytest

from fastdllm import mini_data_v2
from scripts.table2 import mini_check, mini_report_v2, rate_check, store, study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V2 = os.path.join(ROOT, "results", "mini_study_v2")
RATES = os.path.join(ROOT, "results", "mini_study_v2_rates")
ADAPT = os.path.join(ROOT, "reference", "mini2", "adapt")
TEST = os.path.join("relay_s2", "step_300_test_tau_0.85.json")
METRICS = os.path.join("sft_s3", "train_metrics.jsonl")
RATE = "sft_s1_lr0.001_n100_tau_0.85.json"


def set_field(path, **fields):
    with open(path) as f:
        record = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(record, **fields), f)


def first(path, key):
    with open(path) as f:
        return json.load(f)[key]


def flip(path, offset):
    """Invert one byte, at offset from the start (from the end if negative)."""
    where = offset % os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0xFF]))


def report(tmp):
    return mini_report_v2.main([os.path.join(tmp, "v2")])


def report_only(tmp):
    return study.main(["--study=v2", "--report_only", f"--out={os.path.join(tmp, 'v2')}"])


def rate_reader(tmp):
    args = argparse.Namespace(n=100, tau=0.85, out=os.path.join(tmp, "rates"))
    return rate_check.read_kept(os.path.join(tmp, "rates", RATE), "sft_s1_lr0.001", args)


def check_reader(tmp):
    return mini_check.study_record(os.path.join(tmp, "v2", TEST), ["mini2/test/0"])


def keep_step(tmp):  # the study keeps a run's checkpoint where a copy of the same step is kept already
    return store.keep(ADAPT, os.path.join(tmp, "kept"))


def stage_b(tmp):
    st = study.study("v2", smoke=False)
    st.kept, st.out, st.runs = os.path.join(tmp, "kept2"), f"{tmp}/o", f"{tmp}/r"
    return study.stage_b(st)


def build(tmp):
    return mini_data_v2.main([f"--out_dir={os.path.join(tmp, 'data')}", f"--corpus_dir={os.path.join(tmp, 'corpus')}"])


def in_v2(rel, damage):
    return lambda tmp: damage(os.path.join(tmp, "v2", rel))


def write(text):
    def damage(path):
        with open(path, "w") as f:
            f.write(text)
    return damage


# case: (damage(tmp), reader(tmp), what the line must name)
CASES = {
    "result: NFE as strings": (in_v2(TEST, lambda p: set_field(p, nfe=[str(v) for v in first(p, "nfe")])), report, "nfe:"),
    "result: NFE with nulls": (in_v2(TEST, lambda p: set_field(p, nfe=[None] + first(p, "nfe")[1:])), report_only, "nfe:"),
    "result: tau as a string": (in_v2(TEST, lambda p: set_field(p, tau="0.85")), report, "tau:"),
    "result: task ids as numbers": (in_v2(TEST, lambda p: set_field(p, task_ids=list(range(400)))), report, "task_ids:"),
    "result: model a number": (in_v2(TEST, lambda p: set_field(p, model=7)), report, "model:"),
    "result: step a string": (in_v2(TEST, lambda p: set_field(p, step="300")), report_only, "step:"),
    "result: cut short": (in_v2(TEST, write('{"model": "relay_s2", "st')), report, "not JSON"),
    "result: a stray step_x file": (in_v2("relay_s2/step_x", write("x")), report, "step_x"),
    "result read by mini_check: NFE with nulls": (in_v2(TEST, lambda p: set_field(p, nfe=[None] * 400)), check_reader, "nfe:"),
    "result read by rate_check: NFE as strings": (lambda tmp: set_field(os.path.join(tmp, "rates", RATE),
                                                  nfe=["1"] * 100), rate_reader, "nfe:"),
    "train metrics: empty": (in_v2(METRICS, write("")), report, "no records"),
    "train metrics: a record without its step": (in_v2(METRICS, write('{"loss": 1.0, "tokens_per_s": 900.0}\n')), report, "step:"),
    "train metrics: no throughput logged": (in_v2(METRICS, write('{"step": 10, "loss": 1.0}\n')), report, "tokens_per_s:"),
    "train metrics: throughput as a string": (in_v2(METRICS, write('{"step": 10, "tokens_per_s": "fast"}\n')), report, "tokens_per_s:"),
    "pins: data.json not JSON": (in_v2("data.json", write("{")), report, "data.json"),
    "pins: data.json without sha256": (in_v2("data.json", write("{}")), report, "sha256"),
    "build.json: not JSON": (lambda tmp: write("{")(os.path.join(tmp, "data", "build.json")), build, "build.json"),
    "build.json: without its args": (lambda tmp: write("{}")(os.path.join(tmp, "data", "build.json")), build, "build.json"),
    "build.json: args a list": (lambda tmp: write('{"args": []}')(os.path.join(tmp, "data", "build.json")), build, "build.json"),
    "kept model: a flipped weight byte": (lambda tmp: flip(os.path.join(tmp, "kept", "model.safetensors"), -100), keep_step, "corrupted"),
    "kept model: a flipped header byte": (lambda tmp: flip(os.path.join(tmp, "kept", "model.safetensors"), 20), keep_step, "corrupted"),
    "kept model: weights cut short": (lambda tmp: os.truncate(os.path.join(tmp, "kept", "model.safetensors"), 1000), keep_step, "corrupted"),
    "kept model: config edited": (lambda tmp: set_field(os.path.join(tmp, "kept", "config.json"), hidden_size=64), keep_step, "config.json"),
    "kept model: tokenizer edited": (lambda tmp: write("{}")(os.path.join(tmp, "kept", "tokenizer.json")), keep_step, "tokenizer.json"),
    "kept model: an extra file": (lambda tmp: write("x")(os.path.join(tmp, "kept", "notes.txt")), keep_step, "notes.txt"),
    "kept model: manifest not JSON": (lambda tmp: write("{")(os.path.join(tmp, "kept", "manifest.json")), keep_step, "manifest.json"),
    "kept stage B: a flipped weight byte": (lambda tmp: flip(os.path.join(tmp, "kept2", "adapt", "model.safetensors"), -100), stage_b,
                                            "corrupted"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_file_is_one_line(tmp_path, case):
    """Bugs checked (each once): the reader's field check removed (the result cases raised TypeError or printed a
    wrong table), the keep step not verifying a kept copy (returned "kept" on a corrupted one), build.json read
    without its check (JSONDecodeError, KeyError)."""
    tmp = str(tmp_path)
    shutil.copytree(V2, os.path.join(tmp, "v2"))
    shutil.copytree(RATES, os.path.join(tmp, "rates"))
    shutil.copytree(ADAPT, os.path.join(tmp, "kept"))
    shutil.copytree(ADAPT, os.path.join(tmp, "kept2", "adapt"))
    os.makedirs(os.path.join(tmp, "data"))
    os.makedirs(os.path.join(tmp, "corpus", "tokenizer"))
    os.makedirs(os.path.join(tmp, "corpus", "wheels"))
    damage, reader, named = CASES[case]
    damage(tmp)
    report_file = os.path.join(tmp, "v2", "mini_study_v2.md")
    before = open(report_file).read()
    with pytest.raises(SystemExit) as e:
        reader(tmp)
    message = str(e.value)
    assert message and "\n" not in message and named in message, message
    assert open(report_file).read() == before
