"""train_fastdllm.py: SFT noising and loss positions, the rollout objectives' gradient paths, the
four objectives end to end, resume, and a 2-process DeepSpeed ZeRO-3 run (tiny random Qwen2, CPU)."""
import copy
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import train_fastdllm as T
from configurator import load_config
from fastdllm.data import collate, tokenize_conversation, toy_conversations
from fastdllm.model import load_fastdllm, make_tiny_fastdllm, make_tiny_tokenizer
from relay import RolloutBuffer, block_confidence_unmask, rollout_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BD = 8


def _batch(n=2, seed=0, device="cpu"):
    tok = make_tiny_tokenizer()
    rows = [tokenize_conversation(tok, m, 512) for m in toy_conversations(n, seed)]
    x0, maskable = collate(rows, tok.pad_token_id, BD)
    return x0.to(device), maskable.to(device)


def test_sft_noise_one_level_per_block_and_complement(device):
    x0, maskable = _batch(4, device=device)
    B, L = x0.shape
    mask_id = 259
    g = torch.Generator().manual_seed(5)  # the noise generator is a CPU one, the batch on the device
    z, sup = T.sft_noise(x0, maskable, BD, mask_id, g)
    # the same draws by hand: t per block, p = (1 - 1e-3) t + 1e-3, one uniform per token
    g = torch.Generator().manual_seed(5)
    t = torch.rand(B, L // BD, generator=g)
    u = torch.rand(B, L, generator=g)
    m = (u < ((1 - 1e-3) * t + 1e-3).repeat_interleave(BD, 1)).to(device)
    assert torch.equal(sup, torch.cat([m & maskable, ~m & maskable]))
    # every response token is supervised in exactly one copy; prompt and padding never are
    assert torch.equal(sup[:B] ^ sup[B:], maskable) and not (sup[:B] & sup[B:]).any()
    x2 = torch.cat([x0, x0])
    assert torch.equal(z == mask_id, sup) and torch.equal(z[~sup], x2[~sup])


def test_sft_loss_positions_and_token_shift(device):
    """Our loss equals HF's ForCausalLM convention: labels shifted left, logit i-1 scores token i."""
    model = make_tiny_fastdllm(bd_size=BD, seed=2).to(device)
    x0, maskable = _batch(2, device=device)
    g = torch.Generator().manual_seed(0)
    loss = T.sft_loss(model, x0, maskable, BD, model.mask_token_id, g)
    g = torch.Generator().manual_seed(0)
    z, sup = T.sft_noise(x0, maskable, BD, model.mask_token_id, g)
    x2 = torch.cat([x0, x0])
    logits = T.doubled_forward(model, z, x2, None, BD).logits  # (2B, L, V)
    labels = torch.where(sup, x2, torch.full_like(x2, -100))
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(loss, ref)
    # and by hand for a few positions
    i = sup[0].nonzero()[0, 0].item()
    assert i > 0
    manual = F.cross_entropy(logits[0, i - 1][None], x2[0, i][None])
    direct = F.cross_entropy(T.shift_logits(logits)[0, i][None], x2[0, i][None])
    torch.testing.assert_close(manual, direct)


def test_doubled_forward_sees_clean_prefix_only(device):
    """x_t block b sees its own noised block and clean blocks < b, nothing else."""
    model = make_tiny_fastdllm(bd_size=BD, seed=4).to(device).eval()
    L = 4 * BD
    z = torch.randint(0, 256, (1, L)).to(device)
    x0 = torch.randint(0, 256, (1, L)).to(device)
    with torch.no_grad():
        base = T.doubled_forward(model, z, x0, None, BD).logits
        z2 = z.clone(); z2[0, 2 * BD + 1] = (z[0, 2 * BD + 1] + 1) % 256  # noised block 2
        a = T.doubled_forward(model, z2, x0, None, BD).logits
        x2 = x0.clone(); x2[0, BD + 3] = (x0[0, BD + 3] + 1) % 256  # clean block 1
        b = T.doubled_forward(model, z, x2, None, BD).logits
    blk = lambda t, k: t[0, k * BD:(k + 1) * BD]
    for k in (0, 1, 3):
        assert torch.equal(blk(a, k), blk(base, k))
    assert not torch.equal(blk(a, 2), blk(base, 2))
    for k in (0, 1):  # the clean block 1 is seen by noised blocks 2 and 3 only
        assert torch.equal(blk(b, k), blk(base, k))
    for k in (2, 3):
        assert not torch.equal(blk(b, k), blk(base, k))


@pytest.mark.parametrize("variant", ["rollout", "relay_sg", "relay"])
def test_gradient_reaches_forward_1_through_the_relay_only_in_relay_mode(variant, device):
    model = make_tiny_fastdllm(use_relay=variant != "rollout", bd_size=BD, seed=1).to(device)
    if model.relay_layer_norm is not None:
        with torch.no_grad():
            model.relay_layer_norm.weight.fill_(1.0)  # a trained relay, so the path carries signal
    x0, maskable = _batch(2, device=device)
    buf = RolloutBuffer(2, mask_id=model.mask_token_id)
    buf.refill(x0, maskable)
    inner = T.make_step_fn(model, buf, BD, 64, use_relay=variant != "rollout")
    calls, relay_grads = [], []

    def step_fn(z, h):
        calls.append(h)
        logits, h_out = inner(z, h)
        if h_out.requires_grad:
            h_out.register_hook(lambda g: relay_grads.append(g))  # only the relay path uses h_out
        return logits, h_out

    policy = lambda lg, c: block_confidence_unmask(lg, c, 0.85, BD)
    out = rollout_loss(step_fn, **buf.inputs(), K=2, variant=variant, policy=policy)
    buf.update(out)
    out.loss.backward()
    assert len(calls) == 2
    if variant == "rollout":
        assert calls[0] is None and calls[1] is None and buf.h is None and not relay_grads
    else:
        assert calls[0] is None  # cold start: make_step_fn feeds h = 0
        assert calls[1].requires_grad == (variant == "relay")
        assert not buf.h.requires_grad  # what is carried to the next window is detached
        if variant == "relay":
            assert len(relay_grads) == 1 and relay_grads[0].abs().sum() > 0
        else:
            assert not relay_grads


def test_rollout_micro_step_teacher_forces_and_refills(device):
    model = make_tiny_fastdllm(use_relay=True, bd_size=BD, seed=1).to(device)
    x0, maskable = _batch(4, device=device)
    buf = RolloutBuffer(2, mask_id=model.mask_token_id)
    buf.refill(x0[:2], maskable[:2])
    assert torch.equal(buf.z == model.mask_token_id, maskable[:2])  # cold start: whole response masked
    policy = lambda lg, c: block_confidence_unmask(lg, c, 0.85, BD)
    step_fn = T.make_step_fn(model, buf, BD, 64, use_relay=True)
    before = buf.masked().clone()
    with torch.no_grad():
        out = rollout_loss(step_fn, **buf.inputs(), K=2, variant="relay", policy=policy)
    buf.update(out)
    revealed = before & ~buf.masked()
    assert torch.equal(buf.z[revealed], buf.x0[revealed])  # ground-truth tokens, never samples
    # every block with masks reveals at least one token per forward: two rounds -> >= 2 per block
    per_block = revealed.view(2, -1, BD).sum(-1)
    had = before.view(2, -1, BD).sum(-1)
    assert (per_block >= torch.clamp(had, max=2)).all()
    assert len(out.step_losses) == 2
    # run until slot 0 finishes; the next refill puts a new row there and keeps slot 1
    for _ in range(200):
        if buf.finished().any():
            break
        with torch.no_grad():
            buf.update(rollout_loss(step_fn, **buf.inputs(), K=2, variant="relay", policy=policy))
    done = buf.finished()
    assert done.any()
    keep = buf.z[~done].clone()
    buf.refill(x0[2:], maskable[2:])
    assert torch.equal(buf.z[~done], keep)
    assert torch.equal(buf.x0[done], x0[2:2 + int(done.sum())])
    assert (buf.h[done] == 0).all()


def _run(tmp_path, *args):
    T.main(["config/fastdllm_tiny.py", f"--out_dir={tmp_path}", "--deepspeed=", "--bd_size=8", "--log_interval=1", *args])


def _losses(text):
    return [float(v) for v in re.findall(r"step \d+ \| loss ([0-9.]+)", text)]


@pytest.mark.parametrize("objective", T.OBJECTIVES)
def test_each_objective_trains_and_saves_a_loadable_checkpoint(tmp_path, capsys, objective, device):
    os.chdir(ROOT)
    _run(tmp_path, f"--objective={objective}", "--max_iters=3", "--save_interval=0", f"--device={device.type}")
    log = capsys.readouterr().out
    assert len(_losses(log)) == 3
    assert ("relay-grad" in log) == (objective in ("relay_sg", "relay"))
    model, tok = load_fastdllm(str(tmp_path / "ckpt-3"), dtype=torch.float32)
    if objective in ("relay_sg", "relay"):
        assert model.relay_layer_norm is not None and model.relay_layer_norm.weight.abs().sum() > 0  # trained
    else:
        assert model.relay_layer_norm is None


@pytest.mark.parametrize("objective", T.OBJECTIVES)
def test_resume_continues_the_run_exactly(tmp_path, capsys, device, objective):
    """Losses step by step after a resume equal an uninterrupted run's, for every objective (SFT draws its
    noise levels and masks from a generator of its own). Bug checked: that generator's state not restored
    on resume: SFT's losses after the resume differed, while the relay run, the only one tested before,
    passed."""
    os.chdir(ROOT)
    on, obj = f"--device={device.type}", f"--objective={objective}"
    _run(tmp_path / "a", obj, "--max_iters=4", "--save_interval=0", on)
    straight = _losses(capsys.readouterr().out)
    _run(tmp_path / "b", obj, "--max_iters=2", "--save_interval=0", on)
    _run(tmp_path / "b", obj, "--max_iters=4", "--save_interval=0", "--resume=True", on)
    log = capsys.readouterr().out
    assert "resumed from" in log
    assert _losses(log) == straight  # same optimizer, data position, buffer and relay state
    a, _ = load_fastdllm(str(tmp_path / "a" / "ckpt-4"), dtype=torch.float32)
    b, _ = load_fastdllm(str(tmp_path / "b" / "ckpt-4"), dtype=torch.float32)
    # bit-exact on the CPU; CUDA's attention and embedding backward may add with atomics (run-to-run order)
    tol = dict(rtol=0, atol=0) if device.type == "cpu" else dict(rtol=1e-4, atol=1e-6)
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, b.state_dict()[k], **tol)


def test_resume_reads_a_resume_dir_written_before_the_step_rename(tmp_path, capsys):
    """resume/ as written before common.py: state.pt stored the step as "iter_num", there was no
    manifest.json, and the rank file held the data position as (epoch, position in the rank's share).
    Such a directory still resumes exactly with --allow_unverified_resume=True (without it a missing manifest
    is refused: tests/test_missing_digest.py), with a warning that its files are not verified. Checked:
    fails with KeyError when resumed_step reads only "step", when the flag does not let a missing manifest
    through, and when Batches reads the old (epoch, pos) as a global position without saying so."""
    os.chdir(ROOT)
    _run(tmp_path / "a", "--objective=rollout", "--max_iters=3", "--save_interval=0")
    straight = _losses(capsys.readouterr().out)
    _run(tmp_path / "b", "--objective=rollout", "--max_iters=2", "--save_interval=0")
    path = tmp_path / "b" / "resume" / "state.pt"
    state = torch.load(path, weights_only=False)
    state["iter_num"] = state.pop("step")
    torch.save(state, path)
    os.remove(tmp_path / "b" / "resume" / "manifest.json")
    rank_file = tmp_path / "b" / "resume" / "rank0.pt"
    mine = torch.load(rank_file, weights_only=False)
    mine["data"] = {"epoch": mine["data"]["pos"] // 512, "pos": mine["data"]["pos"] % 512}  # 512 toy rows, 1 rank
    torch.save(mine, rank_file)
    capsys.readouterr()
    _run(tmp_path / "b", "--objective=rollout", "--max_iters=3", "--save_interval=0", "--resume=True",
         "--allow_unverified_resume=True")
    captured = capsys.readouterr()
    log = captured.out
    assert "at step 2" in log and _losses(log) == straight[2:] and "are not verified" in captured.err
    assert "saved by an older loader" in log


def test_configs_load_and_errors_are_one_line(tmp_path):
    for name in ("sft", "rollout", "relay_sg", "relay", "tiny"):
        cfg = load_config(T.TrainConfig, [os.path.join(ROOT, "config", f"fastdllm_{name}.py")])
        assert cfg.objective in T.OBJECTIVES
    paper = load_config(T.TrainConfig, [os.path.join(ROOT, "config", "fastdllm_relay.py")])
    assert (paper.device_batch_size, paper.gradient_accumulation_steps, paper.learning_rate, paper.deepspeed) == (2, 16, 5e-6, "zero3")
    os.chdir(ROOT)
    with pytest.raises(SystemExit, match="objective must be one of"):
        _run(tmp_path, "--objective=mlm")
    with pytest.raises(SystemExit, match="python -m fastdllm.data"):
        _run(tmp_path, f"--data={tmp_path}/missing.jsonl")
    with pytest.raises(SystemExit, match="effective_batch"):
        _run(tmp_path, "--effective_batch=64")
    with pytest.raises(SystemExit, match="resume=True but there is no .*resume; drop --resume"):
        _run(tmp_path, "--resume=True")


@pytest.mark.parametrize("flag,message", [
    ("--K=0", "K must be >= 1, got 0"), ("--learning_rate=-1", "learning_rate must be a finite number > 0"),
    ("--bd_size=0", "bd_size must be >= 1, got 0"), ("--learning_rate=nan", "learning_rate"),
    ("--train_tau=1.5", "train_tau must be in [0, 1)"), ("--device_batch_size=0", "device_batch_size must be >= 1"),
    ("--init_from={sudoku}", "is not a Fast-dLLM checkpoint directory (no config.json); it is a Sudoku model")])
def test_bad_values_are_one_line_before_the_data_is_read(tmp_path, monkeypatch, flag, message):
    """Checked before anything is loaded: the tokeniser never runs (it would be the first slow work). Before
    this check, K=0, learning_rate=-1 and bd_size=0 (ZeroDivisionError) ended in tracebacks after the data
    was tokenised, and a Sudoku run as init_from in a FileNotFoundError."""
    os.chdir(ROOT)
    (tmp_path / "sudoku").mkdir()
    (tmp_path / "sudoku" / "ckpt.pt").write_bytes(b"")
    monkeypatch.setattr(T, "load_rows", lambda *a: pytest.fail("the data was read before the check"))
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        _run(tmp_path / "out", flag.format(sudoku=tmp_path / "sudoku"))
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_device_auto_picks_mps_only_without_deepspeed(monkeypatch):
    """Both training scripts resolve device=auto with common.pick_device: cuda, then mps, then cpu; the
    Fast-dLLM run asks for mps only without DeepSpeed (no MPS accelerator), and an explicit mps with
    DeepSpeed is a one-line error. Checked: fails when pick_device ignores allow_mps."""
    from common import pick_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device("auto") == "mps" and pick_device("auto", allow_mps=False) == "cpu"
    assert pick_device("cpu") == "cpu"
    os.chdir(ROOT)
    with pytest.raises(SystemExit, match="DeepSpeed does not run on mps"):
        T.parse_config(["config/fastdllm_tiny.py", "--device=mps"])
    with pytest.raises(SystemExit, match="device must be"):
        T.parse_config(["config/fastdllm_tiny.py", "--device=gpu"])


def test_lr_schedule_warmup_then_cosine():
    cfg = T.TrainConfig(learning_rate=1.0, min_lr=0.0, warmup_iters=10, lr_decay_iters=110)
    assert T.lr_at(0, cfg) == 0.0 and T.lr_at(5, cfg) == 0.5 and T.lr_at(10, cfg) == 1.0
    assert abs(T.lr_at(60, cfg) - 0.5) < 1e-12 and T.lr_at(110, cfg) == 0.0 and T.lr_at(500, cfg) == 0.0


def _torchrun(tmp_path, *args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "train_fastdllm.py", "config/fastdllm_tiny.py", f"--out_dir={tmp_path}", *args]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_two_process_zero3_run_partitions_learns_and_resumes_bit_identically(tmp_path):
    """2 gloo processes, DeepSpeed ZeRO-3 on the CPU accelerator (the first run on a machine also
    JIT-compiles DeepSpeed's shared-memory comm op, about 45 s). A run stopped at step 3 and resumed
    to step 6 ends with the same losses and bit-identical weights as the uninterrupted run, and rank 0
    alone holds the lock for both ranks. Checked to fail when every rank takes the lock (rank 1 finds
    rank 0's and refuses), and when the rank files do not save the data position (the resumed run
    trains on other rows)."""
    run = ["--objective=relay", "--save_interval=0", "--lr_decay_iters=6"]
    out = _torchrun(tmp_path, *run, "--max_iters=6")
    held = re.search(r"held per rank: \[(\d+), (\d+)\] of (\d+) \(whole tensors left on the ranks: (\d+)\)", out)
    assert held, out
    a, b, n, whole = map(int, held.groups())
    assert whole == 0 and a + b >= n and max(a, b) < 0.6 * n  # each rank really holds about half
    losses = _losses(out)
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2])
    model, _ = load_fastdllm(str(tmp_path / "ckpt-6"), dtype=torch.float32)
    assert model.relay_layer_norm.weight.abs().sum() > 0
    _torchrun(tmp_path / "cut", *run, "--max_iters=3")
    resumed = _torchrun(tmp_path / "cut", *run, "--max_iters=6", "--resume=True")
    assert "resumed from" in resumed and _losses(resumed) == losses[3:]
    straight, cut = load_file(tmp_path / "ckpt-6" / "model.safetensors"), load_file(tmp_path / "cut" / "ckpt-6" / "model.safetensors")
    assert straight.keys() == cut.keys() and all(torch.equal(straight[k], cut[k]) for k in straight)
    assert [json.loads(line)["step"] for line in open(tmp_path / "cut" / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_two_process_zero3_resume_and_all_objectives(tmp_path):
    straight = _losses(_torchrun(tmp_path / "a", "--objective=relay", "--max_iters=4", "--save_interval=0"))
    _torchrun(tmp_path / "b", "--objective=relay", "--max_iters=2", "--save_interval=0")
    resumed = _losses(_torchrun(tmp_path / "b", "--objective=relay", "--max_iters=4", "--save_interval=0", "--resume=True"))
    assert resumed == pytest.approx(straight[2:], abs=1e-4)
    for objective in ("sft", "rollout", "relay_sg"):
        _torchrun(tmp_path / objective, f"--objective={objective}", "--max_iters=2", "--save_interval=0")
        load_fastdllm(str(tmp_path / objective / "ckpt-2"), dtype=torch.float32)


@pytest.mark.slow
def test_two_process_ddp_run(tmp_path):
    out = _torchrun(tmp_path, "--deepspeed=", "--objective=relay", "--max_iters=4", "--save_interval=0")
    assert "DDP" in out and len(_losses(out)) == 4
    load_fastdllm(str(tmp_path / "ckpt-4"), dtype=torch.float32)


def test_gradient_checkpointing_keeps_relay_gradients_exact():
    """Non-reentrant checkpointing must recompute both forwards so that BPTT through the relay is unchanged."""
    grads = []
    for ckpt in (False, True):
        model = make_tiny_fastdllm(use_relay=True, bd_size=BD, seed=1)
        with torch.no_grad():
            model.relay_layer_norm.weight.fill_(1.0)
        if ckpt:
            model.gradient_checkpointing_enable()
        model.train()
        calls = []
        mlp_forward = model.model.layers[0].mlp.forward
        model.model.layers[0].mlp.forward = lambda *a, **k: calls.append(1) or mlp_forward(*a, **k)
        x0, maskable = _batch(2)
        buf = RolloutBuffer(2, mask_id=model.mask_token_id)
        buf.refill(x0, maskable)
        step_fn = T.make_step_fn(model, buf, BD, 64, use_relay=True)
        policy = lambda lg, c: block_confidence_unmask(lg, c, 0.85, BD)
        loss = rollout_loss(step_fn, **buf.inputs(), K=2, variant="relay", policy=policy).loss
        assert len(calls) == 2  # the two forwards
        loss.backward()
        assert len(calls) == (4 if ckpt else 2)  # checkpointing really recomputes both in backward
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "model.relay_layer_norm.weight" in grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-6)


def test_memory_profile_runs_on_cpu_and_orders_phases(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import memory_profile
    traces = memory_profile.main(["--init_from=tiny", "--seq_len=64", "--dtype=float32", f"--out={tmp_path}/mp"])
    phases = {r: [e[0] for e in ev] for r, ev in traces.items()}
    assert phases["sft"] == ["fwd"] * 4 + ["bwd"] * 3  # start, 2 layers, fwd_end | 2 layer bwd, bwd_end
    assert phases["relay"] == ["fwd"] * 3 + ["fwd2"] * 3 + ["bwd"] * 5  # both forwards' layers get a backward
    assert os.path.getsize(f"{tmp_path}/mp.png") > 0
    assert sum(1 for _ in open(f"{tmp_path}/mp.csv")) == 1 + len(traces["sft"]) + len(traces["relay"])


def test_zero_init_relay_starts_exactly_as_rollout():
    """gamma = beta = 0: the three rollout variants share losses and base gradients at the first window
    (d R(h) / d h = gamma = 0 blocks the BPTT path); they part once gamma moves."""
    def grads(variant, gamma=0.0):
        model = make_tiny_fastdllm(use_relay=variant != "rollout", bd_size=BD, seed=1)
        if gamma and model.relay_layer_norm is not None:
            with torch.no_grad():
                model.relay_layer_norm.weight.fill_(gamma)
        x0, maskable = _batch(2)
        buf = RolloutBuffer(2, mask_id=model.mask_token_id)
        buf.refill(x0, maskable)
        # a non-zero carried state, as in a later window
        buf.h = torch.randn(2, x0.shape[1], 64, generator=torch.Generator().manual_seed(0))
        step_fn = T.make_step_fn(model, buf, BD, 64, use_relay=variant != "rollout")
        policy = lambda lg, c: block_confidence_unmask(lg, c, 0.85, BD)
        out = rollout_loss(step_fn, **buf.inputs(), K=2, variant=variant, policy=policy)
        out.loss.backward()
        return out.loss.item(), {n: p.grad for n, p in model.named_parameters() if "relay" not in n}
    l_roll, g_roll = grads("rollout")
    for variant in ("relay_sg", "relay"):
        l, g = grads(variant)
        assert l == l_roll
        for n in g_roll:
            assert torch.equal(g[n], g_roll[n]), (variant, n)
    _, g_sg = grads("relay_sg", gamma=1.0)
    _, g_bptt = grads("relay", gamma=1.0)
    assert any(not torch.equal(g_sg[n], g_bptt[n]) for n in g_sg)


@pytest.mark.slow
def test_zero3_one_process_matches_plain_training(tmp_path):
    """Loss scaling, the lr schedule and clipping mean the same under DeepSpeed as in the plain loop (fp32)."""
    logs = []
    for ds in ("", "zero3"):
        r = subprocess.run([sys.executable, "train_fastdllm.py", "config/fastdllm_tiny.py", f"--deepspeed={ds}", "--objective=sft",
                            "--max_iters=5", "--save_interval=0", "--grad_clip=0.5", f"--out_dir={tmp_path}/{ds or 'plain'}"],
                           cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        logs.append(re.findall(r"step \d+ \| loss [0-9.]+ \| lr \S+ \| grad-norm [0-9.]+", r.stdout))
    assert len(logs[0]) == 5 and logs[0] == logs[1]


def _grads(model):
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("objective", ["sft", "rollout", "relay_sg", "relay"])
def test_optimizer_step_equals_the_plain_reference(objective, device):
    """One optimizer step of 3 accumulated micro-batches through train_fastdllm.micro_step_loss (what the
    training loop calls) against the plain per-position loops of tests/fastdllm_reference.py: loss and
    every gradient to 1e-10 in float64 (1e-5 on another device: the reference runs on the CPU, and
    transformers' RMSNorm computes in float32, which rounds differently there). Checked to fail when: the
    loss is rounded to float32 (errors of 1e-7); the SFT mean runs per micro-batch instead of
    over the window; the rollout loss is not divided by the accumulation count; relay_sg does not detach
    h_s1; the relay is dropped in step 1 of a micro-step after the first."""
    from fastdllm_reference import reference_rollout_step, reference_sft_step
    G = 3
    use_relay = objective in ("relay_sg", "relay")
    model = make_tiny_fastdllm(use_relay=use_relay, bd_size=BD, seed=1, initializer_range=0.2).double()
    if use_relay:
        with torch.no_grad():
            model.relay_layer_norm.weight.normal_(std=0.5)
            model.relay_layer_norm.bias.normal_(std=0.1)
    ref_model = model if device.type == "cpu" else copy.deepcopy(model)  # the reference runs on the CPU
    model.to(device)
    x0, maskable = _batch(2 * G, seed=3)
    mask_id = model.mask_token_id
    policy = lambda lg, c: block_confidence_unmask(lg, c, 0.85, BD)
    window = [(x0[2 * i:2 * i + 2], maskable[2 * i:2 * i + 2]) for i in range(G)]
    n_window = int(maskable.sum())
    buf = RolloutBuffer(2, mask_id=mask_id) if objective != "sft" else None
    total = 0.0
    g = torch.Generator().manual_seed(7)
    for xb, mb in window:
        loss, _ = T.micro_step_loss(model, objective, xb.to(device), mb.to(device), buf, n_window, G, BD, mask_id, 64,
                                    2, policy, g)
        loss.backward()
        total += float(loss.detach())
    got = {k: v.cpu() for k, v in _grads(model).items()}
    model.zero_grad(set_to_none=True)
    if objective == "sft":
        ref = reference_sft_step(ref_model, window, BD, mask_id, torch.Generator().manual_seed(7))
    else:
        assert not buf.finished().any()  # refill never replaced a slot: the reference keeps the first rows
        slots = dict(x0=window[0][0], z=torch.where(window[0][1], mask_id, window[0][0]), maskable=window[0][1], h=None)
        ref = reference_rollout_step(ref_model, slots, G, objective, BD, mask_id)
    want = _grads(ref_model)
    tol = 1e-10 if device.type == "cpu" else 1e-5
    assert abs(total - ref) < tol * max(1.0, abs(ref))
    assert got.keys() == want.keys() and len(got) > 10
    for k in got:
        torch.testing.assert_close(got[k], want[k], atol=tol, rtol=tol, msg=k)


def test_random_1p5b_uses_the_real_tokenizer_padding_and_saves_nothing(tmp_path, monkeypatch):
    """init_from=random-1.5b (the GPU check's 1.5B-shape step): the model gets the 1.5B config's
    vocabulary and special ids and the real Qwen tokenizer (ids up to 151665 must fit the embedding),
    pad_to sets the training length, save_interval=-1 writes nothing. The shapes are shrunk here
    (width and depth only) so it runs on a CPU. Fails when pad_to is ignored, when a checkpoint is
    written at the end, and when the tiny tokenizer is used (each checked)."""
    small = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    monkeypatch.setattr(T, "FAST_DLLM_V2_1_5B", {**T.FAST_DLLM_V2_1_5B, **small})
    cfg = T.parse_config(["--init_from=random-1.5b", "--data=toy", "--deepspeed=", "--device=cpu", "--dtype=float32",
                          "--objective=relay", "--pad_to=100", "--effective_batch=0", "--gradient_accumulation_steps=1",
                          "--gradient_checkpointing=False", "--max_iters=1", "--save_interval=-1", f"--out_dir={tmp_path}/run"])
    run = T.setup(cfg)
    assert run.model.config.vocab_size == 151936 and run.tokenizer.convert_tokens_to_ids("|<MASK>|") == 151665
    assert run.seq_len == 100
    x0, _ = collate(run.batches.next(), run.tokenizer.pad_token_id, cfg.bd_size, run.seq_len)
    assert x0.shape[1] == 128  # 100 rounded up to whole 32-token blocks
    T.main(["--init_from=random-1.5b", "--data=toy", "--deepspeed=", "--device=cpu", "--dtype=float32", "--objective=sft",
            "--effective_batch=0", "--gradient_accumulation_steps=1", "--gradient_checkpointing=False", "--max_iters=1",
            "--save_interval=-1", f"--out_dir={tmp_path}/run2"])
    assert not os.path.exists(tmp_path / "run2")


def test_a_mask_token_in_a_response_is_a_one_line_error_at_load(tmp_path, capsys):
    """A response holding the mask token is refused once at load with one line (the per-step check in
    relay.py is a device-side assert on CUDA, which would end the process instead). Fails with the
    load check removed (checked: the run then trains on the row on the CPU until relay's ValueError)."""
    os.chdir(ROOT)
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": f"{i + 1}."} for i in range(7)]
    rows.append({"prompt": "Say the mask token.", "answer": "It is |<MASK>| here."})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match=r"training row \d+ has the mask token \(id \d+\) in its response") as e:
        _run(tmp_path / "run", f"--data={data}", "--max_iters=1", "--device_batch_size=2", "--effective_batch=0")
    assert "\n" not in str(e.value)


def _rows_file(path, n=6):
    with open(path, "w") as f:
        for i in range(n):  # different answers, so a row is known by its tokens; short and long ones, so that
            # slots finish apart (a block commits at least one token per round)
            answer = str(i) if i % 2 else f"def add{i}(x):\n    return x + {i}"
            f.write(json.dumps({"prompt": f"Write add{i}(x).", "answer": answer}) + "\n")


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_sft_logs_the_rows_of_each_window_counted_by_hand(tmp_path):
    """6 rows, 2 rows x 2 micro-steps: each SFT step trains 4 new rows and finishes them; distinct rows 4, then 6
    (step 2 takes the last 2 of epoch 1 and 2 of epoch 2), then 6. Bugs checked: counting one micro-batch per step
    (2 new), counting row visits instead of distinct rows (8, 12)."""
    os.chdir(ROOT)
    _rows_file(tmp_path / "rows.jsonl")
    _run(tmp_path / "run", "--objective=sft", "--max_iters=3", "--save_interval=0", "--device=cpu",
         f"--data={tmp_path / 'rows.jsonl'}", "--device_batch_size=2", "--gradient_accumulation_steps=2")
    recs = _records(tmp_path / "run" / "metrics.jsonl")
    assert [(r["new_rows"], r["finished_rows"], r["distinct_rows"]) for r in recs] == [(4, 4, 4), (4, 4, 6), (4, 4, 6)]
    assert "mask_ratio" not in recs[0] and "relay_gamma_norm" not in recs[0]
    # resumed after step 1, the run still knows the rows it trained on (bug checked: the ledger not kept in resume/)
    args = ["--objective=sft", "--save_interval=1", "--device=cpu", f"--data={tmp_path / 'rows.jsonl'}",
            "--device_batch_size=2", "--gradient_accumulation_steps=2"]
    _run(tmp_path / "resumed", "--max_iters=1", *args)
    _run(tmp_path / "resumed", "--max_iters=3", "--resume=True", *args)
    assert [r["distinct_rows"] for r in _records(tmp_path / "resumed" / "metrics.jsonl")] == [4, 6, 6]


def test_relay_logs_the_rows_its_buffer_really_took(tmp_path, monkeypatch):
    """A relay run's logged rows against what its buffer held, recorded by a wrapper around RolloutBuffer that knows
    each row by its tokens: new rows are the finished slots' rows after a refill, finished ones the slots with no mask
    left after a rollout; the ledger's distinct rows must be those very rows. Bugs checked: logging the last rows of
    the incoming batch instead of the first (other rows), counting the loader's rows (2 a micro-step), a mask ratio
    over all cells instead of the response's."""
    os.chdir(ROOT)
    _rows_file(tmp_path / "rows.jsonl", n=40)
    took, steps = [], []

    class Watched(RolloutBuffer):
        def refill(self, x0, maskable, *a, **k):
            done = self.finished()
            n = super().refill(x0, maskable, *a, **k)
            took.extend(tuple(self.x0[i].tolist()) for i in range(self.size) if done[i])
            steps[-1]["new"] += int(done.sum())
            steps[-1]["cells"] += 2 * int(self.maskable.sum())  # K = 2 states per rollout
            return n

        def update(self, out):
            super().update(out)
            steps[-1]["finished"] += int(self.finished().sum())
            steps[-1]["masked"] += int(sum(out.n_masked))

    real_step, runs_seen = T.train_step, []

    def counted_step(run, step):
        steps.append({"new": 0, "finished": 0, "masked": 0, "cells": 0})
        runs_seen.append(run)
        return real_step(run, step)

    monkeypatch.setattr(T, "RolloutBuffer", Watched)
    monkeypatch.setattr(T, "train_step", counted_step)
    _run(tmp_path / "run", "--objective=relay", "--max_iters=6", "--save_interval=0", "--device=cpu",
         f"--data={tmp_path / 'rows.jsonl'}", "--device_batch_size=2", "--gradient_accumulation_steps=2")
    recs = _records(tmp_path / "run" / "metrics.jsonl")
    assert [(r["new_rows"], r["finished_rows"]) for r in recs] == [(s["new"], s["finished"]) for s in steps]
    assert recs[-1]["distinct_rows"] == len(set(took)) > 2  # rows were finished and replaced
    run = runs_seen[-1]
    ledger_rows = {tuple(collate([run.batches.rows[i]], run.tokenizer.pad_token_id, run.cfg.bd_size, run.seq_len)[0][0]
                         .tolist()) for i in run.ledger.seen}
    assert ledger_rows == set(took)
    for r, s in zip(recs, steps):
        assert r["mask_ratio"] == pytest.approx(s["masked"] / s["cells"], abs=1e-5)
        assert r["relay_gamma_norm"] > 0 and r["relay_h_norm"] > 0


def test_data_rows_limits_the_rows_trained_on(tmp_path):
    """data_rows=3 of 6 rows, 4 rows per step: the run cycles over the first 3 (distinct 3, 3), and a limit above the
    file's rows is one line. Bug checked: the limit ignored (distinct 4, 6)."""
    os.chdir(ROOT)
    _rows_file(tmp_path / "rows.jsonl")
    args = ["--objective=sft", "--save_interval=0", "--device=cpu", f"--data={tmp_path / 'rows.jsonl'}",
            "--device_batch_size=2", "--gradient_accumulation_steps=2"]
    _run(tmp_path / "run", "--max_iters=2", "--data_rows=3", *args)
    assert [r["distinct_rows"] for r in _records(tmp_path / "run" / "metrics.jsonl")] == [3, 3]
    with pytest.raises(SystemExit, match="data_rows=7 but .* holds 6 rows"):
        _run(tmp_path / "run2", "--max_iters=1", "--data_rows=7", *args)


def test_data_start_reads_on_in_the_row_order(tmp_path, monkeypatch):
    """data_start=4, 4 rows per step, seed 7: the first step trains on rows 4-7 of epoch 0's permutation (numpy's
    generator seeded [seed, epoch], written out here), the rows an unstarted run takes at its second step. Bug
    checked: data_start ignored (the run reads rows 0-3 again)."""
    os.chdir(ROOT)
    _rows_file(tmp_path / "rows.jsonl", n=12)
    real_step, runs_seen = T.train_step, []
    monkeypatch.setattr(T, "train_step", lambda run, step: runs_seen.append(run) or real_step(run, step))
    _run(tmp_path / "run", "--objective=sft", "--max_iters=1", "--save_interval=0", "--device=cpu", "--seed=7",
         f"--data={tmp_path / 'rows.jsonl'}", "--device_batch_size=2", "--gradient_accumulation_steps=2",
         "--data_start=4")
    assert runs_seen[-1].ledger.seen == set(np.random.default_rng([7, 0]).permutation(12)[4:8].tolist())


def test_init_from_passes_its_pin_to_the_loader(tmp_path, capsys):
    """--pin reaches the checkpoint check: a pin given for a local checkpoint directory (which its manifest checks) is
    refused in one line. Bug checked: the pin not passed on (the run trained, the pin unread)."""
    from fastdllm.model import save_fastdllm
    os.chdir(ROOT)
    save_fastdllm(make_tiny_fastdllm(use_relay=False, bd_size=BD), make_tiny_tokenizer(), str(tmp_path / "parent"))
    with pytest.raises(SystemExit, match="a pin .* is for snapshots in the hub cache"):
        _run(tmp_path / "run", f"--init_from={tmp_path / 'parent'}", f"--pin={tmp_path / 'x.pin.json'}",
             "--objective=sft", "--max_iters=1", "--save_interval=0", "--device=cpu")
