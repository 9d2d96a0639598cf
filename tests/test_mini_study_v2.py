"""Table 2 in miniature v2 (scripts/table2/study.py --study=v2): the schedule that ends, the validation loss, the
checkpoint and rate chosen on validation, the clipped-step share, the report's interval, and the driver's resuming."""
import gzip
import hashlib
import json
import math
import os
import time

import numpy as np
import pytest
import torch

import train_fastdllm
from configurator import load_config
from scripts.table2 import mini_report_v2, study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("objective", ["sft", "relay"])
def test_the_v2_schedule_ends_near_zero_after_a_short_warmup(objective):
    cfg = load_config(train_fastdllm.TrainConfig, [os.path.join(ROOT, f"config/fastdllm_mini2_{objective}.py")])
    peak = cfg.learning_rate
    assert cfg.warmup_iters <= 0.1 * cfg.max_iters and cfg.lr_decay_iters == cfg.max_iters
    assert train_fastdllm.lr_at(cfg.warmup_iters, cfg) == pytest.approx(peak)
    assert train_fastdllm.lr_at(cfg.max_iters - 1, cfg) < 1e-3 * peak  # the last step's rate
    assert train_fastdllm.lr_at((cfg.max_iters + cfg.warmup_iters) // 2, cfg) == pytest.approx(peak / 2, rel=0.02)


def write_result(out: str, name: str, step: int, tau: float, protocol: str) -> None:
    """A valid kept result (two tasks) at its place in out."""
    path = study.store.result_path(out, name, step, tau, protocol)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ids = [f"mini2/{'val' if protocol == 'val' else 'test'}/{i}" for i in range(2)]
    record = study.store.stamp(dict(model=name, step=step, tau=tau, protocol=protocol, task_ids=ids,
                                                  base=[1, 0], plus=[1, 0], nfe=[40, 40]))
    with open(path, "w") as f:
        json.dump(record, f)


def fake_run(path, val: dict[int, float], kept: list[int]) -> str:
    """A run folder as train_fastdllm.py leaves it: metrics.jsonl with validation losses, complete ckpt-N folders."""
    os.makedirs(path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for step in range(10, max(val) + 1, 10):
            f.write(json.dumps({"step": step, "loss": 1.0} | ({"val_loss": val[step]} if step in val else {})) + "\n")
    for step in kept:
        os.makedirs(os.path.join(path, f"ckpt-{step}"))
        open(os.path.join(path, f"ckpt-{step}", "manifest.json"), "w").write("{}")
    return str(path)


def test_the_checkpoint_is_the_kept_one_of_lowest_validation_loss(tmp_path):
    run = fake_run(tmp_path / "r", {20: 0.9, 40: 0.5, 60: 0.3, 80: 0.6}, kept=[40, 80])
    assert study.chosen_step(run) == 40  # 60 is lower but was not kept
    run = fake_run(tmp_path / "tie", {50: 0.4, 100: 0.4}, kept=[50, 100])
    assert study.chosen_step(run) == 100
    with pytest.raises(SystemExit, match="no kept checkpoint has a validation loss"):
        study.chosen_step(fake_run(tmp_path / "none", {50: 0.4}, kept=[100]))


def test_each_method_takes_the_rate_of_its_lowest_validation_loss(tmp_path):
    fake_run(tmp_path / "sft_s1_lr0.0003", {50: 0.8, 100: 0.5}, [50, 100])
    fake_run(tmp_path / "sft_s1_lr0.001", {50: 0.6, 100: 0.55}, [50, 100])
    fake_run(tmp_path / "relay_s1_lr0.0003", {50: 0.8, 100: 0.7}, [50, 100])
    fake_run(tmp_path / "relay_s1_lr0.001", {50: 0.9, 100: 0.45}, [50, 100])
    assert study.choose_rate(str(tmp_path), "sft", (3e-4, 1e-3)) == 3e-4
    assert study.choose_rate(str(tmp_path), "relay", (3e-4, 1e-3)) == 1e-3


def test_the_clipped_share_counts_the_steps_above_the_clip():
    interval = train_fastdllm.Interval(grad_clip=1.0)
    for norm, loss in ((0.5, 2.0), (1.5, 4.0), (1.0, 3.0), (9.0, 7.0)):
        interval.add({"grad_norm": norm, "loss": loss, "l1": 0.0, "l2": 0.0, "new_rows": 32, "finished_rows": 32})
    assert interval.means() == {"loss": 4.0, "l1": 0.0, "l2": 0.0, "new_rows": 32, "finished_rows": 32,
                                "clipped": 0.5}  # 1.0 itself is not clipped


def test_the_report_adds_up_the_clipped_share_over_steps_not_records():
    records = [{"step": 10, "clipped": 1.0}, {"step": 25, "clipped": 0.0}, {"step": 30, "clipped": 0.2}]
    assert mini_report_v2.step_counts(records) == [10, 15, 5]


def test_the_validation_loss_is_the_sft_loss_on_fixed_masks(tmp_path):
    """Twice the same value (fixed masks); equal to the SFT loss computed by hand from the same masks; training mode
    restored; the same whatever the run's own noise generator has drawn."""
    val = tmp_path / "val.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"add {i} and {i + 1}"},
                          {"role": "assistant", "content": f"the sum is {2 * i + 1}, as computed"}]} for i in range(5)]
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = train_fastdllm.parse_config([os.path.join(ROOT, "config/fastdllm_tiny.py"), "--deepspeed=", "--data=toy", f"--val_data={val}",
                                       "--device=cpu", "--objective=sft", "--device_batch_size=2",
                                       "--gradient_accumulation_steps=1", "--effective_batch=0",
                                       f"--out_dir={tmp_path / 'run'}"])
    run = train_fastdllm.setup(cfg)
    first = train_fastdllm.validation_loss(run)
    torch.rand(100, generator=run.noise_gen)
    assert train_fastdllm.validation_loss(run) == first and run.backend.module.training
    gen = torch.Generator().manual_seed(train_fastdllm.VAL_MASK_SEED)
    total, count = 0.0, 0
    model = run.model.eval()
    with torch.no_grad():
        length = max(len(ids) for ids, _ in run.val_rows)
        for i in range(0, 5, 2):
            x0, maskable = train_fastdllm.collate(run.val_rows[i:i + 2], run.tokenizer.pad_token_id, 32, length)
            t = torch.rand(x0.shape[0], x0.shape[1] // 32, generator=gen)
            p = ((1 - 1e-3) * t + 1e-3).repeat_interleave(32, dim=1)
            m = torch.rand(x0.shape, generator=gen) < p
            sup2 = torch.cat([m & maskable, ~m & maskable])
            z = torch.where(sup2, torch.full_like(torch.cat([x0, x0]), model.config.mask_token_id), torch.cat([x0, x0]))
            logits = train_fastdllm.doubled_forward(model, z, torch.cat([x0, x0]), None, 32).logits
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # position i predicts token i
            total += float(torch.nn.functional.cross_entropy(logits[sup2], torch.cat([x0, x0])[sup2], reduction="sum"))
            count += int(maskable.sum())
    assert first == pytest.approx(total / count, rel=1e-5)


def test_the_t_quantiles_match_the_density():
    """Each tabulated 97.5% quantile of Student's t integrates to 0.975 (trapezoid rule on the density)."""
    for df, q in mini_report_v2.T975.items():
        x = np.linspace(-q - 2000.0 if df < 3 else -200.0, q, 2_000_001)
        density = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2)) * (1 + x ** 2 / df) ** (-(df + 1) / 2)
        assert np.trapezoid(density, x) == pytest.approx(0.975, abs=2e-4 if df < 3 else 5e-5), df


def test_the_primary_interval_and_its_verdict_by_hand():
    # differences 1, 2, 3, 4, 5, 6: mean 3.5, s.d. 1.8708, t(5) 2.571 -> half-width 1.9637
    m, lo, hi = mini_report_v2.interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert (m, lo, hi) == pytest.approx((3.5, 3.5 - 1.9637, 3.5 + 1.9637), abs=1e-3)

    def result(model, nfe):
        return {"model": model, "protocol": "test", "tau": 0.85, "step": 300, "nfe": [nfe, nfe], "plus": [1, 0],
                "base": [1, 0], "task_ids": ["mini2/test/0", "mini2/test/1"]}
    sft = [result(f"sft_s{s}", 30.0) for s in range(1, 7)]
    relay = [result(f"relay_s{s}", 30.0 + d) for s, d in zip(range(1, 7), (1, 2, 3, 4, 5, 6))]
    text = "\n".join(mini_report_v2.primary(sft + relay))
    assert "+3.50" in text and "+1.54 to +5.46" in text and "±3.00" in text and text.split("\n")[0].endswith(": decisive")
    wide = [result(f"relay_s{s}", 30.0 + d) for s, d in zip(range(1, 7), (-9, 12, 3, -4, 15, 6))]
    assert "NOT decisive" in "\n".join(mini_report_v2.primary(sft + wide))
    # before six pairs there is no verdict: three pairs inside the bound (1, 2, 3: mean 2, half-width 2.48 < 3)
    # say so as interim, and so does the secondary line
    three = mini_report_v2.primary(sft[:3] + relay[:3])[0] + mini_report_v2.secondary(sft[:3] + relay[:3])[0]
    assert "interim, inside the bound (the verdict is read at 6 seed pairs)" in three and ": decisive" not in three
    assert "interim, non-inferior so far" in three  # equal pass@1 in every pair
    # one seed pair (the report while seeds 2-6 run) has no interval: said in words, never printed as nan
    one = "\n".join(mini_report_v2.primary(sft[:1] + relay[:1]) + mini_report_v2.secondary(sft[:1] + relay[:1]))
    assert "no interval from one seed pair" in one and "nan" not in one and "interim, not inside the bound" in one


def test_the_frontier_s_mean_is_taken_over_seeds_at_each_tau_they_share():
    """Two seeds, the second not decoded at tau 0.95: the mean frontier has two points, each the mean of the seeds'
    NFE and pass@1 at one tau (by hand: (45, 15) and (50, 30)). Fails when the mean pairs points by position
    instead of by tau (checked: pairing the seeds' last taus gives (47.5, 20.0) first)."""
    def result(model, tau, nfe, passed, n):  # n tasks, each at NFE nfe, the first `passed` of them pass
        return {"model": model, "protocol": "test", "tau": tau, "step": 300, "nfe": [nfe] * n,
                "plus": [1] * passed + [0] * (n - passed), "base": [0] * n,
                "task_ids": [f"mini2/test/{i}" for i in range(n)]}
    s1 = [result("relay_s1", 0.7, 40, 1, 10), result("relay_s1", 0.85, 45, 2, 10), result("relay_s1", 0.95, 50, 9, 10)]
    s2 = [result("relay_s2", 0.7, 50, 1, 5), result("relay_s2", 0.85, 55, 2, 5)]  # 20%, 40%
    curve = mini_report_v2.mean_curve([s1, s2])  # flat: pytest 9.2's approx does not take nested sequences
    assert len(curve) == 2 and [v for point in curve for v in point] == pytest.approx([45.0, 15.0, 50.0, 30.0])


def test_a_report_made_while_seeds_run_names_each_pair_by_its_own_seed():
    """While the study runs, SFT's seed 2 may be kept before Relay's: the per-seed line pairs seed 3 with seed 3
    (failed with the labels taken from every SFT seed: s2 was printed with seed 3's numbers)."""
    def result(model, nfe, device="cpu"):
        return {"model": model, "protocol": "test", "tau": 0.85, "step": 300, "nfe": [nfe], "plus": [1], "base": [1],
                "task_ids": ["mini2/test/0"], "device": device}
    results = [result("sft_s1", 40.0), result("relay_s1", 44.0), result("sft_s2", 50.0),
               result("sft_s3", 60.0, "cuda"), result("relay_s3", 57.0, "cuda")]
    text = "\n".join(mini_report_v2.primary(results))
    assert "s1: 40.00, 44.00, +4.00; s3: 60.00, 57.00, -3.00" in text and "s2" not in text
    assert mini_report_v2.devices(results) == "cpu: relay_s1, sft_s1, sft_s2; cuda: relay_s3, sft_s3"
    assert mini_report_v2.devices(results[:3]) == "cpu, every result"


def test_an_error_in_one_lane_stops_the_study_in_one_line_naming_the_job():
    """Any exception, not only a failed command's SystemExit: the other lane takes no new job and the study exits
    non-zero (failed with lanes catching SystemExit only: the thread died, the study went on)."""
    done = []

    def broken(say):
        raise KeyError("nfe")

    jobs = [study.Job("good_1", lambda say: done.append(1)), study.Job("bad", broken)] + [
        study.Job(f"later_{i}", lambda say, i=i: done.append(i)) for i in range(20)]
    with pytest.raises(SystemExit) as e:
        study.run_lanes(jobs, lanes=1)
    assert e.value.code == "the study stopped: bad: KeyError: 'nfe'" and done == [1]


def v2_study(tmp_path) -> study.Study:
    st = study.study("v2", smoke=False)
    st.out, st.kept, st.runs = str(tmp_path / "out"), str(tmp_path / "kept"), str(tmp_path / "runs")
    st.pins = os.path.join(st.out, "data.json")
    return st


def test_a_study_resumed_on_another_machine_trains_only_what_the_repository_does_not_keep(tmp_path, monkeypatch):
    """A fresh machine has the committed results/ and reference/ but no runs/: with the pilot's choice kept, only
    the chosen seed-1 runs whose results are not kept are trained, and no run with every result kept trains again
    (failed with choice.json ignored: all four pilots ran again; with kept results ignored: relay_s2 trained again;
    with the seeds ready as soon as a choice was kept: relay_s1 read its pilot's run while it trained).
    Without a kept choice (two lanes), no seed starts before every pilot has trained, and the choice is then kept
    (failed with the seeds ready at once: relay_s1 started while the last pilot trained)."""
    st = v2_study(tmp_path)
    os.makedirs(st.out)
    with open(os.path.join(st.out, "choice.json"), "w") as f:
        json.dump({"chosen": {"sft": 0.001, "relay": 0.0003}}, f)
    for name in ("sft_s1", "relay_s2"):  # every result kept; sft_s1's weights too
        for where, tau in st.protocol():
            write_result(st.out, name, 300, tau, where)
    os.makedirs(tmp_path / "kept" / "sft_s1")
    monkeypatch.setattr(study.store, "is_complete", lambda folder: os.path.isdir(folder))
    trained = []
    monkeypatch.setattr(study, "decode", lambda *a: None)
    monkeypatch.setattr(study, "train", lambda st, config, name, args, say: time.sleep(0.2) or trained.append(name))
    monkeypatch.setattr(study, "v2_run", lambda st, o, s, say: trained.append(study.run_name(o, s)))
    study.run_lanes(study.v2_jobs(st), 2)
    assert trained[0] == "relay_s1_lr0.0003"  # relay_s1 is read from it: it waits
    assert sorted(trained) == sorted(["relay_s1_lr0.0003", "relay_s1"] + [f"sft_s{s}" for s in range(2, 7)] +
                                     [f"relay_s{s}" for s in range(3, 7)])
    assert st.choice == {"sft": 0.001, "relay": 0.0003}
    # no choice kept: the four pilots first, then the choice from their validation losses, then the seeds
    os.remove(os.path.join(st.out, "choice.json"))
    del st.choice
    trained.clear()
    for name, loss in (("sft_s1_lr0.0003", 0.6), ("sft_s1_lr0.001", 0.5), ("relay_s1_lr0.0003", 0.4),
                       ("relay_s1_lr0.001", 0.7)):
        fake_run(tmp_path / "runs" / name, {100: loss}, [100])
    study.run_lanes(study.v2_jobs(st), 2)
    assert sorted(trained[:4]) == ["relay_s1_lr0.0003", "relay_s1_lr0.001", "sft_s1_lr0.0003", "sft_s1_lr0.001"]
    assert len(trained) == 4 + 10 and json.load(open(os.path.join(st.out, "choice.json")))["chosen"] == {"sft": 0.001,
                                                                                                    "relay": 0.0003}


def test_a_damaged_choice_is_one_line(tmp_path):
    st = v2_study(tmp_path)
    os.makedirs(st.out)
    (tmp_path / "out" / "choice.json").write_text('{"chosen": {"sft": 0.002, "relay": 0.001}}')
    with pytest.raises(SystemExit, match="choice.json does not hold a choice among --lrs=0.0003,0.001"):
        study.kept_choice(st)


def test_each_kept_result_names_the_device_it_was_decoded_on(tmp_path, monkeypatch):
    """A GPU loan's seeds are kept beside the CPU's in one schema, so every result says where it ran, and the decode
    ran there (failed with the device left out of the kept record, and with --device not passed to eval_code.py)."""
    st = v2_study(tmp_path)
    st.device, st.lanes = "cuda", 8
    monkeypatch.setattr(study.os, "cpu_count", lambda: 16)  # a GPU machine's cores, shared by the lanes' judging
    commands, kept = [], []
    monkeypatch.setattr(study.runs, "sh", lambda cmd, **kw: commands.append(cmd))
    monkeypatch.setattr(study.store, "compact", lambda out, path, meta: kept.append(meta))
    monkeypatch.setattr(study.store, "read_kept", lambda path: {})
    monkeypatch.setattr(study, "model_digest", lambda model: "digest")
    monkeypatch.setattr(study.common, "file_sha256", lambda path: "sha")
    study.decode(st, "model_dir", "relay_s2", 300, True, [("test", 0.85), ("val", 0.85)])
    assert [meta["device"] for meta in kept] == ["cuda", "cuda"]
    assert all("--device=cuda" in cmd and "--workers=2" in cmd for cmd in commands) and "--limit=200" in commands[1]
    st.device = "cpu"  # on the CPU each lane owns one core
    study.decode(st, "model_dir", "relay_s3", 300, True, [("test", 0.85)])
    assert "--workers=1" in commands[-1]


def write_data(folder, texts: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    for name, text in texts.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


def test_the_study_reads_only_the_data_its_kept_results_were_scored_on(tmp_path):
    """The first build's sha256 are kept beside the results; a rebuilt file that differs (a changed generator) stops
    the study in one line naming it (failed with the comparison left out: the changed test file was used)."""
    st = v2_study(tmp_path)
    st.data_dir = str(tmp_path / "data")
    write_data(st.data_dir, {name: f"rows of {name}\n" for name in st.pinned})
    study.check_pins(st)
    kept = json.load(open(st.pins))["sha256"]
    assert kept["test.jsonl"] == hashlib.sha256(b"rows of test.jsonl\n").hexdigest()
    study.check_pins(st)  # the same files pass
    write_data(st.data_dir, {"test.jsonl": "other rows\n"})
    with pytest.raises(SystemExit, match=r"data: test.jsonl differ from the data pinned in .*out/data.json"):
        study.check_pins(st)
    for damaged in ('{"sha256": [1, 2]}', "{not json"):  # a damaged record is one line too, never a traceback
        open(st.pins, "w").write(damaged)
        with pytest.raises(SystemExit, match="data.json does not hold the sha256 of every file"):
            study.check_pins(st)


def test_prebuilt_data_is_unpacked_then_checked_and_missing_files_are_one_line(tmp_path):
    """A GPU loan carries the files gzipped: each is unpacked to the very bytes kept (failed with the .gz read as
    it is: the sha256 check refused the copy), and a file carried neither way stops the study in one line."""
    st = v2_study(tmp_path)
    st.data_dir = str(tmp_path / "built")
    texts = {name: f"rows of {name}\n" * 50 for name in st.pinned}
    write_data(st.data_dir, texts)
    study.check_pins(st)
    carried = tmp_path / "carried"
    os.makedirs(carried)
    for name, text in texts.items():
        with gzip.open(carried / f"{name}.gz", "wt") as f:
            f.write(text)
    packed = tmp_path / "packed"  # what gpu_prepare.sh carries unpacks to the same bytes
    study.pack_prebuilt(st, str(packed))
    assert sorted(os.listdir(packed)) == sorted(f"{name}.gz" for name in st.pinned)
    for folder in (carried, packed):
        st.data_dir = str(folder)
        study.unpack_prebuilt(st)
        study.check_pins(st)
    os.remove(carried / "val.jsonl")
    os.remove(carried / "val.jsonl.gz")
    st.data_dir = str(carried)
    with pytest.raises(SystemExit, match="--prebuilt: .*carried holds no val.jsonl"):
        study.unpack_prebuilt(st)


def kept_summaries(out: str) -> dict[tuple[str, str], dict]:
    """(model, protocol) -> the kept JSON at tau 0.85 (one step per run), for the test and the reworded tasks."""
    summary: dict[tuple[str, str], dict] = {}
    for model in os.listdir(out):  # step_<k>_<protocol>_tau_0.85.json
        folder = os.path.join(out, model)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            for protocol in ("test", "reworded"):
                if name.endswith(f"_{protocol}_tau_0.85.json"):
                    summary[(model, protocol)] = json.load(open(os.path.join(folder, name)))
    return summary


@pytest.mark.parametrize("folder, base_label", [("mini_study_v2", None), ("mini_study_v3", "Fast-dLLM v2 (B3)")])
def test_the_readme_states_the_kept_results(folder, base_label):
    """The README's rows of the study (400 test tasks, tau 0.85: pass@1 base / plus and NFE, the held-out wording's
    plus / NFE, mean ± s.d. over the kept seeds; v3's, v2 in one line) and each study's primary outcome (Relay - SFT
    NFE with its 95% t interval) are what the kept JSONs' own summary fields give, recomputed here with `statistics`
    and a printed t table rather than the report's code. Fails with a number edited in the README, or a seed kept
    and the README not updated."""
    import statistics
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().replace("−", "-")  # the typeset minus
    summary = kept_summaries(os.path.join(ROOT, "results", folder))

    def cell(values: list[float]) -> str:
        return f"{statistics.mean(values):.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")

    labels = (("base", base_label), ("sft", "Vanilla SFT"), ("rollout", "Rollout"), ("relay_sg", "Relay (sg)"),
              ("relay", "Relay")) if base_label else ()
    for method, label in labels:
        models = sorted(m for m, p in summary if p == "test" and (m == method or m.rsplit("_s", 1)[0] == method))
        test = [summary[(m, "test")] for m in models]
        if not test and method in ("rollout", "relay_sg"):
            continue  # not run yet
        reworded = [summary[(m, "reworded")] for m in models if (m, "reworded") in summary]
        assert test and all(r["n"] >= 400 for r in test), method
        held_out = (f"{cell([r['pass1_plus_authors'] for r in reworded])} / {cell([r['mean_nfe'] for r in reworded])}"
                    if reworded else "-")
        row = (f"| {label} | {len(test)} | {cell([r['pass1_base'] for r in test])} / "
               f"{cell([r['pass1_plus_authors'] for r in test])} | {cell([r['mean_nfe'] for r in test])} | {held_out} |")
        assert row in readme, f"the README lacks the row {row}"
    seeds = sorted(int(m.split("_s")[1]) for m, p in summary if p == "test" and m.startswith("relay_s")
                   and m[len("relay_s"):].isdigit() and (f"sft_s{m.split('_s')[1]}", "test") in summary)
    diffs = [summary[(f"relay_s{s}", "test")]["mean_nfe"] - summary[(f"sft_s{s}", "test")]["mean_nfe"] for s in seeds]
    t975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}[len(diffs) - 1]
    half = t975 * statistics.stdev(diffs) / math.sqrt(len(diffs))
    m = statistics.mean(diffs)
    stated = f"{m:+.1f} NFE (95% interval {m - half:+.1f} to {m + half:+.1f}, {len(diffs)} seed pairs"
    assert stated in readme, f"the README lacks the primary outcome {stated}"


def test_the_docs_state_the_report_s_numbers():
    """docs/table2_miniature.md carries the report's Table 2 rows, its primary outcome, the first secondary one and the
    training rows as they are for the kept JSONs. Fails when a seed is kept and the page not updated, or a number in
    the page is edited."""
    page = open(os.path.join(ROOT, "docs", "table2_miniature.md"), encoding="utf-8").read()
    out = os.path.join(ROOT, "results", "mini_study_v2")
    results = mini_report_v2.store.load(out)
    expected = (mini_report_v2.table(results)[2:] + mini_report_v2.primary(results) + mini_report_v2.secondary(results)[:1]
                + mini_report_v2.training(out)[2:])
    for line in expected:
        assert line in page, f"docs/table2_miniature.md lacks: {line}"


@pytest.mark.parametrize("folder", ["mini_study_v2", "mini_study_v3", "mini_study_v3_t"])
def test_the_kept_report_is_the_one_the_kept_results_give(tmp_path, folder):
    """Each study's kept report (results/<folder>/<folder>.md; the docs point at it) is what --report_only writes for
    the kept JSONs today, redrawn in a copy of the folder. Fails when a seed is kept and the report not redrawn."""
    import shutil
    kept = os.path.join(ROOT, "results", folder)
    copy = shutil.copytree(kept, tmp_path / folder, ignore=shutil.ignore_patterns("*.png", "*.md"))
    redrawn = mini_report_v2.report(str(copy), figures=str(tmp_path / "figures"))
    assert open(os.path.join(kept, f"{folder}.md"), encoding="utf-8").read() == redrawn


def test_a_replication_folder_gets_its_study_s_report(tmp_path):
    """results/mini_study_v3_cuda (part P's fine-tunes on a GPU) is drawn as v3's report, checkpoint 200 and B3 as
    the base, and its kept report is the one its JSONs give. Failed with the report chosen by the exact folder name:
    drawn as v2's (each run's step chosen on validation, into mini_study_v2.md); with the NFE split naming stage B."""
    import shutil
    kept = os.path.join(ROOT, "results", "mini_study_v3_cuda")
    copy = shutil.copytree(kept, tmp_path / "mini_study_v3_cuda", ignore=shutil.ignore_patterns("*.png"))
    redrawn = mini_report_v2.report(str(copy), figures=str(tmp_path / "figures"))
    assert redrawn.startswith("# Table 2 in miniature v3: report") and "each run's checkpoint 200" in redrawn
    assert "Decoded on: cpu: base; cuda: relay_s2" in redrawn
    assert "stage B" not in redrawn and redrawn.count("| Fast-dLLM v2 (B3) | 1 |") == 2  # Table 2 and the NFE split
    assert open(os.path.join(kept, "mini_study_v3.md"), encoding="utf-8").read() == redrawn


def test_a_loan_carries_no_b3_mixture_and_needs_b3_kept(tmp_path):
    """v3 under --prebuilt: the loan's files are all the pinned ones but adapt.jsonl (B3's mixture, 4 MB gzipped, which
    no fine-tune reads: the 64 MiB a loan carries has no room for it), checked against the pins without it; and a
    loan without B3 kept stops in one line, as the mixture to train it is not there. Failed with adapt.jsonl packed
    (the listing), and with the pins checked over every pinned file (KeyError on the missing mixture)."""
    st = study.study("v3", False)
    st.data_dir, st.out, st.kept = str(tmp_path / "built"), str(tmp_path / "out"), str(tmp_path / "kept")
    st.pins = os.path.join(st.out, "data.json")
    write_data(st.data_dir, {name: f"rows of {name}\n" * 20 for name in st.pinned})
    study.check_pins(st)
    packed = tmp_path / "packed"
    study.pack_prebuilt(st, str(packed))
    assert sorted(os.listdir(packed)) == sorted(f"{name}.gz" for name in st.pinned if name != "adapt.jsonl")
    st.data_dir, st.prebuilt = str(packed), True
    with pytest.raises(SystemExit, match="--prebuilt: B3 is not kept in .*kept/b3"):
        study.prepare(st, False)
    study.unpack_prebuilt(st)
    study.check_pins(st)  # no adapt.jsonl here, and none needed


def test_non_inferiority_reads_the_interval_s_lower_end_not_the_mean():
    """Six pairs whose pass@1 differences are -2 x 5 and -8 points: mean -3 (above the -5 margin), but the interval
    (t(5) 2.571, s.d. 2.449: -5.57 to -0.43) reaches below it, so Relay is not shown non-inferior; with every
    difference -3 it is. Bug checked: the reading taken from the mean difference (says non-inferior for both)."""
    def result(model, passed):  # 100 tasks, the first `passed` of them pass
        return {"model": model, "protocol": "test", "tau": 0.85, "step": 300, "nfe": [40.0] * 100,
                "plus": [1] * passed + [0] * (100 - passed), "base": [1] * 100,
                "task_ids": [f"mini2/test/{i}" for i in range(100)]}
    sft = [result(f"sft_s{s}", 30) for s in range(1, 7)]
    spread = [result(f"relay_s{s}", 30 + d) for s, d in zip(range(1, 7), (-2, -2, -2, -2, -2, -8))]
    line = mini_report_v2.secondary(sft + spread)[0]
    assert "-3.0 (95% interval -5.6 to -0.4" in line and line.endswith(": not shown non-inferior")
    same = [result(f"relay_s{s}", 27) for s in range(1, 7)]
    assert mini_report_v2.secondary(sft + same)[0].endswith(": non-inferior")


def test_a_run_is_finished_only_when_every_result_of_its_protocol_is_kept(tmp_path):
    """v2_finished() on --out holding one (and then all but one, then all) of sft_s2's five protocol results: only
    the last counts as finished, so a resumed study decodes what is missing; the seed-1 pair also needs its kept
    weights. Bug checked: any kept result counting as finished (a study that stopped after one decoding would never
    decode the rest)."""
    st = v2_study(tmp_path)
    wanted = st.protocol()
    assert len(wanted) == 5
    for n in (1, len(wanted) - 1, len(wanted)):
        for protocol, tau in wanted[:n]:
            write_result(st.out, "sft_s2", 300, tau, protocol)
            write_result(st.out, "sft_s1", 300, tau, protocol)
        assert study.v2_finished(st, "sft", 2) == (n == len(wanted)), n
    assert not study.v2_finished(st, "sft", 1)  # its weights are not kept


def test_a_t_run_is_finished_only_with_its_test_and_validation_kept_at_one_step(tmp_path):
    """t_finished() on a T run: a kept test decoding alone is not finished (a variant job decodes test, then
    validation: a study killed between them must decode validation when resumed), nor is validation kept at
    another step; test and validation at one step are. Bug checked: any kept test decoding counting as finished."""
    st = study.study("v3t", smoke=False)
    st.out = str(tmp_path / "out")
    assert not study.t_finished(st, "relay_lr0.001_s2")  # nothing kept
    write_result(st.out, "relay_lr0.001_s2", 300, 0.85, "test")
    assert not study.t_finished(st, "relay_lr0.001_s2")
    write_result(st.out, "relay_lr0.001_s2", 250, 0.85, "val")
    assert not study.t_finished(st, "relay_lr0.001_s2")
    write_result(st.out, "relay_lr0.001_s2", 300, 0.85, "val")
    assert study.t_finished(st, "relay_lr0.001_s2")
