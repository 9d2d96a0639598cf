"""Fast-dLLM v2 block-diffusion decoding: cache exactness, relay carry, batching, NFE and stop handling.

The equivalence tests run the tiny random Qwen2 in float64 so that 'equal within tolerance' is a strict
claim: the relay carry iterates h -> f(h) inside a block and would amplify float32 rounding over long
generations. The NFE / stop tests use a scripted stand-in model whose predictions depend only on the
position, so the expected counts follow from the unmasking rule by hand.
"""
from types import SimpleNamespace

import pytest
import torch

from fastdllm.generate import generate, sample_tokens, unmask_rule
from fastdllm.model import make_tiny_fastdllm, make_tiny_tokenizer
from helpers import BLOCK_STOP, ScriptedBlockModel, block_script

THRESHOLD = 0.5  # low enough that the random model often commits several tokens per forward


@pytest.fixture(scope="module")
def tiny():
    # a wide init makes the random model's predictions peaked and varied (the default 0.02 gives a near
    # uniform softmax, so every forward would commit exactly one token and the threshold path goes untested)
    model = make_tiny_fastdllm(use_relay=True, seed=0, initializer_range=0.5).double().eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(model.relay_layer_norm.weight, std=0.5)  # a trained-looking, non-zero relay
    torch.nn.init.normal_(model.relay_layer_norm.bias, std=0.1)
    tok = make_tiny_tokenizer()
    prompts = [tok(text)["input_ids"] for text in ("def add(a, b):", "Write a function that sorts a list of numbers.\n" * 2,
                                                 "x" * 64)]
    return model, prompts  # prompt lengths 14, 98 and 64 (a multiple of the block size)


def on(tiny, device):
    """The module's tiny model on `device` (moved in place: every test of a run uses the same device)."""
    model, prompts = tiny
    return model.to(device), prompts


def _run(model, prompts, **kw):
    kw = {"max_new_tokens": 40, "threshold": THRESHOLD, "stop_token_id": -1, "trace": True, "decode": "batch_invariant", **kw}
    return generate(model, prompts, **kw)


def _assert_same(a, b, atol=1e-8):
    assert a.tokens == b.tokens
    assert a.nfe == b.nfe
    assert len(a.trace) == len(b.trace)
    for ta, tb in zip(a.trace, b.trace):
        assert ta["rows"] == tb["rows"] and ta["committed"] == tb["committed"]
        torch.testing.assert_close(ta["logits"], tb["logits"], atol=atol, rtol=0)


@pytest.mark.parametrize("relay_carry", [False, True])
def test_prefix_cache_equals_full_recomputation(tiny, relay_carry, device):
    model, prompts = on(tiny, device)
    cached = _run(model, prompts, relay_carry=relay_carry)
    full = _run(model, prompts, relay_carry=relay_carry, prefix_cache=False)
    _assert_same(cached, full)
    assert max(c for t in cached.trace for c in t["committed"]) > 1  # the threshold path was exercised


@pytest.mark.parametrize("relay_carry", [False, True])
def test_sub_block_cache_is_exact_with_one_sub_block(tiny, relay_carry, device):
    # with sub_block_size == block_size the DualCache refreshes the whole block each forward: exact
    model, prompts = on(tiny, device)
    dual = _run(model, prompts, relay_carry=relay_carry, sub_block_size=32, sub_block_cache=True)
    full = _run(model, prompts, relay_carry=relay_carry, sub_block_size=32, prefix_cache=False)
    _assert_same(dual, full)


def test_sub_block_cache_partial_forwards_exact_for_one_layer(tiny, device):
    # With sub-blocks of 8 the DualCache reads stale keys/values for the rest of the block, so in general
    # it differs from full recomputation. In a 1-layer model without relay, keys/values depend only on
    # each position's own token, so nothing is stale and the partial forwards (the sub-block plus the
    # position before it, written in place) must reproduce the uncached logits exactly.
    _, prompts = tiny
    model = make_tiny_fastdllm(seed=0, initializer_range=0.5, num_hidden_layers=1).double().to(device).eval()
    dual = _run(model, prompts, sub_block_cache=True)
    full = _run(model, prompts, prefix_cache=False)
    _assert_same(dual, full)
    # and partial forwards did happen: some sub-block took more than one forward
    keys = [(t["block"], t["sub_block"]) for t in dual.trace]
    assert len(keys) > len(set(keys))


def test_relay_carry_changes_decoding(tiny, device):
    # guards the equivalence tests above against a carry that silently does nothing
    model, prompts = on(tiny, device)
    plain, carry = _run(model, prompts), _run(model, prompts, relay_carry=True)
    assert plain.tokens != carry.tokens or plain.nfe != carry.nfe
    # a zero relay LayerNorm (the fresh Relay init) is an exact no-op
    zero = make_tiny_fastdllm(use_relay=True, seed=0, initializer_range=0.5).double().to(device).eval()
    _assert_same(_run(zero, prompts), _run(zero, prompts, relay_carry=True), atol=0)


@pytest.mark.parametrize("kw", [dict(), dict(relay_carry=True), dict(relay_carry=True, sub_block_cache=True)])
def test_batched_equals_one_by_one(tiny, kw, device):
    model, prompts = on(tiny, device)
    batched = _run(model, prompts, **kw)
    for i, p in enumerate(prompts):
        alone = _run(model, [p], **kw)
        assert alone.tokens[0] == batched.tokens[i]
        assert alone.nfe[0] == batched.nfe[i]


def test_threshold_one_commits_one_token_per_forward(tiny, device):
    model, prompts = on(tiny, device)
    out = _run(model, prompts, threshold=1.0)
    for t in out.trace:
        assert [c for c, a in zip(t["committed"], t["active"]) if a] == [1] * sum(t["active"])
    for p, toks, n in zip(prompts, out.tokens, out.nfe):
        # every generated position is decoded by one forward, except block starts (autoregressive)
        ar = sum(1 for pos in range(len(p), len(p) + len(toks)) if pos % 32 == 0)
        # positions after max_new_tokens in the last block are decoded too (and dropped)
        tail = (-(len(p) + len(toks))) % 32
        assert n == len(toks) - ar + tail


def test_max_new_tokens_and_no_mask_left(tiny, device):
    model, prompts = on(tiny, device)
    out = _run(model, prompts, max_new_tokens=5)
    mask_id = model.config.mask_token_id
    assert [len(t) for t in out.tokens] == [5, 5, 5]
    assert all(mask_id not in t for t in out.tokens)
    assert out.stopped == [False, False, False]


# -----------------------------------------------------------------------------
# scripted stand-in model (helpers.ScriptedBlockModel): the logit at position q predicts token q+1 with a fixed confidence


def expected(plen: int, max_new: int, bs: int, sb: int, tau: float, stop_at: int = -1):
    """NFE, tokens and blocks with NFE by hand: per sub-block, commit {conf > tau} + the most confident, until none
    masked."""
    last = plen + max_new - 1
    nfe, toks, stopped, blocks = 0, {}, False, 0
    b = plen // bs * bs
    while True:
        nfe_before = nfe
        for s in range(b, b + bs, sb):
            todo = [j for j in range(s, s + sb) if j >= plen and not (j == b and b >= plen and j > 0)]
            while todo:
                if not stopped:
                    nfe += 1
                conf = {j: block_script(j, stop_at)[1] for j in todo}
                best = max(todo, key=lambda j: (conf[j], -j))
                done = [j for j in todo if conf[j] > tau or j == best]
                stopped = stopped or stop_at in done
                todo = [j for j in todo if j not in done]
        blocks += nfe > nfe_before
        for j in range(max(b, plen), b + bs):
            toks[j] = block_script(j, stop_at)[0]
        if stopped or last < b + bs:
            break
        b += bs
        stopped = stop_at == b  # the block's first token is autoregressive
    end = stop_at if stopped else last + 1
    return nfe, [toks[j] for j in range(plen, end)], stopped, blocks


@pytest.mark.parametrize("plen,max_new", [(3, 20), (8, 17), (13, 1), (16, 30)])
def test_nfe_accounting_scripted(plen, max_new, device):
    model = ScriptedBlockModel().to(device)
    out = generate(model, [[5] * plen], max_new_tokens=max_new, threshold=0.85, sub_block_size=4, block_size=8,
                   decode="batch_invariant")
    nfe, toks, stopped, blocks = expected(plen, max_new, 8, 4, 0.85)
    assert out.nfe == [nfe] and out.tokens == [toks] and out.stopped == [stopped] and out.blocks == [blocks]


def test_stop_token_scripted(device):
    # row 0 (prompt 3) reaches the stop at position 21; row 1 (prompt 25) starts after it and runs on
    model = ScriptedBlockModel(stop_at=21).to(device)
    out = generate(model, [[5] * 3, [5] * 25], max_new_tokens=40, threshold=0.85, sub_block_size=4, block_size=8,
                   trace=True, decode="batch_invariant")
    for r, plen in enumerate((3, 25)):
        nfe, toks, stopped, blocks = expected(plen, 40, 8, 4, 0.85, stop_at=21)
        assert out.nfe[r] == nfe and out.tokens[r] == toks and out.stopped[r] == stopped and out.blocks[r] == blocks
    assert out.stopped == [True, False] and len(out.tokens[0]) == 21 - 3 and BLOCK_STOP not in out.tokens[0]
    # the finished row left the batch after its block (16..23): later forwards run one row
    assert all(t["rows"] == [1] for t in out.trace if t["block"] >= 24)
    assert all(t["rows"] == [0, 1] for t in out.trace if t["block"] < 24)


def test_prefill_and_cache_updates_are_not_counted():
    model = ScriptedBlockModel()
    out = generate(model, [[5] * 16], max_new_tokens=16, threshold=0.85, sub_block_size=4, block_size=8,
                   decode="batch_invariant")
    sizes = [n for _, _, n in model.calls]
    # one prefill of 16 positions, denoising forwards of whole blocks (8), one cache update (8)
    assert sizes[0] == 16 and sizes.count(8) == out.nfe[0] + 1


# -----------------------------------------------------------------------------
# pieces


def test_unmask_rule():
    conf = torch.tensor([[0.9, 0.2, 0.95, 0.3], [0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.5, 0.5]])
    masked = torch.tensor([[True, True, False, True], [True, True, True, False], [False] * 4])
    got = unmask_rule(conf, masked, 0.85)
    want = torch.tensor([[True, False, False, False], [False, False, True, False], [False] * 4])
    assert torch.equal(got, want)


def test_sample_tokens_greedy_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    tok, conf = sample_tokens(logits)
    assert tok.item() == 0 and conf.item() == pytest.approx(logits.softmax(-1)[0, 0].item())
    # top_p small enough to keep only the best token: sampling is deterministic and confident
    g = torch.Generator().manual_seed(0)
    tok, conf = sample_tokens(logits.expand(50, 4), temperature=1.0, top_p=0.3, generator=g)
    assert tok.eq(0).all() and torch.allclose(conf, torch.ones(50))
    # top_p = 1 samples the full distribution (each token at least once in 2000 draws)
    tok, _ = sample_tokens(logits.expand(2000, 4), temperature=1.0, top_p=1.0, generator=g)
    assert set(tok.tolist()) == {0, 1, 2, 3}


def test_bad_arguments(tiny):
    model, prompts = tiny
    mask_id = model.config.mask_token_id
    for kw, msg in [(dict(prompts=[[]]), "non-empty"), (dict(prompts=[[1, mask_id]]), "mask token"),
                    (dict(sub_block_size=5), "multiple"), (dict(max_new_tokens=0), "max_new_tokens"),
                    (dict(sub_block_cache=True, prefix_cache=False), "prefix_cache"), (dict(threshold=1.5), "threshold"),
                    (dict(decode="fast"), "decode"), (dict(max_new_tokens=16), "block_size"),
                    (dict(sub_block_cache=True, relay_carry=True), "sub-block cache"),
                    (dict(max_new_tokens=4096), "context")]:
        with pytest.raises(ValueError, match=msg):
            generate(model, **{"prompts": prompts, **kw})
    with pytest.raises(ValueError, match="relay"):
        generate(make_tiny_fastdllm(use_relay=False), prompts, relay_carry=True)


def test_top_p_sampling_is_seeded(tiny, device):
    model, prompts = on(tiny, device)
    # the generator lives where the logits are sampled: torch.multinomial refuses a CPU one for CUDA logits
    run = lambda seed: generate(model, prompts[:2], max_new_tokens=20, temperature=1.0, top_p=0.9, stop_token_id=-1,
                                generator=torch.Generator(device=device).manual_seed(seed),
                                decode="batch_invariant").tokens
    a, b, c = run(0), run(0), run(1)
    assert a == b and a != c
    assert all(model.config.mask_token_id not in t and len(t) == 20 for t in a)


def test_a_generator_on_another_device_is_a_clear_error(tiny, device):
    """Sampling runs on the model's device; a generator elsewhere is refused up front in one line rather
    than failing inside torch.multinomial. Checked: fails when generate() stops calling _check_generator."""
    model, prompts = on(tiny, device)
    elsewhere = SimpleNamespace(device=torch.device("cuda" if device.type == "cpu" else "cpu"))  # only .device is read
    with pytest.raises(ValueError, match="make it with torch.Generator"):
        generate(model, prompts[:1], max_new_tokens=32, temperature=1.0, generator=elsewhere)


def test_command_line_on_the_tiny_model(capsys):
    import fastdllm.chat
    answer = fastdllm.chat.main(["--model=tiny", "--max_new_tokens=32", "--relay_carry=True", "--prompt=hi"])
    printed = capsys.readouterr().out
    assert answer in printed and "NFE" in printed
    with pytest.raises(SystemExit, match="does not exist"):
        fastdllm.chat.main(["--model=/nonexistent/checkpoint"])
    with pytest.raises(SystemExit, match="cuda_graph=True needs the model on a CUDA device"):  # passed on, refused
        fastdllm.chat.main(["--model=tiny", "--max_new_tokens=32", "--cuda_graph=True", "--device=cpu"])
