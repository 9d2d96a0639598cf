"""generate(..., cuda_graph=True): the static-shape block forward (fastdllm/graphs.py) against the plain prefix cache.

The reference is the plain path, itself tested equal to full recomputation (tests/test_fastdllm_generate.py).
The tiny random Qwen2 runs in float64, so equal logits within 1e-8 is a strict claim. On the CPU the static
forward runs without capture (GRAPH_DEVICES gains "cpu"); with --device=cuda the graphs are captured and
replayed, and the same tests check them.
"""
import pytest
import torch

import fastdllm.generate as gen
import fastdllm.graphs
from fastdllm.generate import generate
from fastdllm.graphs import BlockGraphs
from fastdllm.model import make_tiny_fastdllm, make_tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_fastdllm(use_relay=True, seed=0, initializer_range=0.5).double().eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(model.relay_layer_norm.weight, std=0.5)  # a non-zero relay, as after training
    torch.nn.init.normal_(model.relay_layer_norm.bias, std=0.1)
    text = make_tiny_tokenizer()("Write a function that sorts a list of numbers.\n" * 4)["input_ids"]
    return model, text


@pytest.fixture
def graphs_here(monkeypatch, device):
    monkeypatch.setattr(gen, "GRAPH_DEVICES", ("cuda", "cpu"))
    # the attention's span grows every two blocks (512 would span these short sequences whole from the start)
    monkeypatch.setattr(fastdllm.graphs, "SPAN_STEP", 64)


# five rows whose prompts end in different sub-blocks of block 0 and in later blocks: rows start decoding in
# different forwards of one block (some with a carry, some without), and finish in different blocks, so
# the batch shrinks 5 -> 3 (run as 4 rows, one of them stale) -> 1
SHORT = (5, 14, 40, 70, 98)
LONG = (40, 70, 98)  # every prompt covers block 0: the prefill runs


def _both(model, prompts, **kw):
    kw = {"max_new_tokens": 40, "threshold": 0.5, "stop_token_id": -1, "trace": True, **kw}
    return generate(model, prompts, **kw), generate(model, prompts, cuda_graph=True, **kw)


def _assert_same(plain, graphed):
    assert graphed.tokens == plain.tokens
    assert graphed.nfe == plain.nfe and graphed.stopped == plain.stopped
    assert len(graphed.trace) == len(plain.trace)
    for a, b in zip(plain.trace, graphed.trace):
        assert a["rows"] == b["rows"] and a["committed"] == b["committed"]
        # rows with nothing to decode in the sub-block are computed but never read (the plain path may
        # give them another relay input), so only the active rows' logits must agree
        active = torch.tensor(a["active"])
        torch.testing.assert_close(b["logits"][active], a["logits"][active], atol=1e-8, rtol=0)


@pytest.mark.parametrize("decode", ["batch_invariant", "authors"])
@pytest.mark.parametrize("relay_carry", [False, True])
@pytest.mark.parametrize("lengths", [SHORT, LONG], ids=["short", "long"])
def test_graphed_forward_equals_the_prefix_cache(tiny, graphs_here, device, decode, relay_carry, lengths):
    model, text = tiny
    model.to(device)
    plain, graphed = _both(model, [text[:n] for n in lengths], relay_carry=relay_carry, decode=decode)
    _assert_same(plain, graphed)
    if decode == "batch_invariant" and lengths == SHORT:  # rows left mid-way through the decoding
        assert len({len(t["rows"]) for t in plain.trace}) >= 3


def test_stop_tokens_shrink_the_batch(tiny, graphs_here, device):
    """Rows that commit the stop token leave after their block: the remaining rows' cache rows move."""
    model, text = tiny
    model.to(device)
    prompts = [text[:n] for n in SHORT]
    free = generate(model, prompts, max_new_tokens=64, threshold=0.5, stop_token_id=-1, relay_carry=True,
                    decode="batch_invariant")
    early = [t for row in free.tokens for t in row[:40]]
    stop = max(set(early), key=early.count)  # a token the model often produces: rows stop at different places
    plain, graphed = _both(model, prompts, max_new_tokens=64, stop_token_id=stop, relay_carry=True,
                           decode="batch_invariant")
    _assert_same(plain, graphed)
    assert any(plain.stopped) and len({len(t["rows"]) for t in plain.trace}) >= 2


def test_the_block_forward_traces_as_one_graph():
    """What a CUDA graph needs and a CPU can check: torch.compile(fullgraph=True) traces the whole static
    forward (model, relay, cache writes) without a break, so it has no host sync (.item(), .tolist()) and no
    Python branch on tensor values, either of which would fail or freeze a capture."""
    model = make_tiny_fastdllm(use_relay=True, seed=0).eval()
    graphs = BlockGraphs(model, batch=4, capacity=96, block_size=32, capture=False)
    x = torch.randint(0, 300, (4, 96))
    x[:, 40:] = model.config.mask_token_id
    graphs.prefill(x, 32)
    graphs.block(x, 32, torch.randn(4, 32, model.config.hidden_size), torch.tensor([True, False, True, True]))
    torch._dynamo.reset()
    with torch.no_grad():
        traced = torch.compile(graphs._forward, backend="eager", fullgraph=True)(4, 64)
    torch.testing.assert_close(traced.logits, graphs._forward(4, 64).logits)


def test_relay_rows_gate_the_carry_per_row(tiny):
    """FastDLLM.embed: a row outside relay_rows gets exactly the plain embedding, a row inside it the relay."""
    model, text = tiny
    model.cpu()
    ids = torch.tensor([text[:8], text[:8]])
    ids[:, 4:] = model.config.mask_token_id
    h = torch.randn(2, 8, model.config.hidden_size, dtype=torch.float64)
    gated = model.embed(ids, h, torch.tensor([False, True]))
    torch.testing.assert_close(gated[0], model.embed(ids[:1])[0], atol=0, rtol=0)
    torch.testing.assert_close(gated[1], model.embed(ids[1:], h[1:])[0], atol=0, rtol=0)


def test_cuda_graph_off_cuda_is_a_one_line_error(tiny):
    model, text = tiny
    model.cpu()
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        generate(model, [text[:10]], max_new_tokens=32, cuda_graph=True)


def test_cuda_graph_refuses_the_other_caches(tiny, graphs_here):
    model, text = tiny
    model.cpu()
    for kw in (dict(prefix_cache=False), dict(sub_block_cache=True)):
        with pytest.raises(ValueError, match="needs prefix_cache=True and sub_block_cache=False"):
            generate(model, [text[:10]], max_new_tokens=32, cuda_graph=True, **kw)
