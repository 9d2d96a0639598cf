"""generate(decode="authors"), the default: the authors' batch procedure behind paper Table 2.

Two independent oracles: the plain no-cache transcription in tests/fastdllm_reference.py, and values pinned
from a transcription of the authors' code made outside this repository (same tiny float64 model, same
prompts). The model helpers below are frozen copies so that later edits of make_tiny_fastdllm /
make_tiny_tokenizer cannot silently move the pinned fixture.
"""
import copy

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from fastdllm.generate import generate
from fastdllm.model import FastDLLM
from fastdllm_reference import reference_decode
from helpers import BLOCK_STOP, ScriptedBlockModel

STOP_ID = 242  # a byte the random model emits now and then: a stand-in for <|im_end|>
PROMPTS = ("Write a function that adds two numbers a and b.",
           "def fib(n):\n    '''Return the n-th Fibonacci number.'''\n",
           "Sort the list in place and return it, please, using any algorithm you like.",
           "x = [1, 2, 3]\nprint(sum(x)) and then more text")


def frozen_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """make_tiny_tokenizer() as of the pinned values: 256 byte symbols, then <|im_end|> 256,
    <|endoftext|> 257, <|im_start|> 258, |<MASK>| 259."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "|<MASK>|"])


def frozen_tiny_model() -> FastDLLM:
    """make_tiny_fastdllm(use_relay=True, seed=0, initializer_range=0.5) as of the pinned values, in float64,
    with a non-zero relay LayerNorm (torch.manual_seed(1); weight ~ N(0, 0.5), bias ~ N(0, 0.1))."""
    config = Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
                         attention_dropout=0.0, use_sliding_window=False, bd_size=32, relay_layer=-1,
                         mask_token_id=259, bos_token_id=257, eos_token_id=256, pad_token_id=256,
                         initializer_range=0.5, use_relay=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = FastDLLM(Qwen2ForCausalLM(config), use_relay=True).double().eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(model.relay_layer_norm.weight, std=0.5)
    torch.nn.init.normal_(model.relay_layer_norm.bias, std=0.1)
    return model


@pytest.fixture(scope="module")
def fixture():
    tok = frozen_tiny_tokenizer()
    return frozen_tiny_model(), [tok(t)["input_ids"] for t in PROMPTS], tok.pad_token_id


def on(model, device):
    """The model on `device` for generate(); the module's CPU copy stays for the CPU reference."""
    return model if device.type == "cpu" else copy.deepcopy(model).to(device)


def _run(model, prompts, **kw):
    return generate(model, prompts, **{"max_new_tokens": 96, "threshold": 0.5, "stop_token_id": STOP_ID, **kw})


def test_prompt_lengths_of_the_pinned_fixture(fixture):
    """The pinned values were computed on prompts of 47, 56, 75 and 46 tokens; a wrong prompt text (e.g. a line
    break folded into "ple\\nase", which gives 76) would make the pinned comparisons meaningless."""
    _, prompts, _ = fixture
    assert [len(p) for p in prompts] == [47, 56, 75, 46]


# This fixture's relay carry is chaotic: scaling every weight by (1 + 1e-10 noise) changes the carry's
# tokens or NFE in every carry case compared below (1e-12 already in the mixed-length ones), while the
# mixed-length cases without the carry stay unchanged even at 1e-7. Carry values pinned or
# computed on the CPU therefore hold only on the CPU; on a GPU (whose float64 matmuls round differently
# and whose transformers RMSNorm runs in float32) they are compared with a relay scaled by RELAY_GAIN,
# where noise of 1e-7 changes no output and the carry still changes every case's tokens.
ON_CPU_ONLY = "carry values pinned or computed on the CPU are chaotic in the last bit: they hold only on the CPU"
RELAY_GAIN = 0.1


def scaled_relay(model, gain: float):
    """A copy of the model with its relay LayerNorm's weight and bias times `gain` (1.0: the model itself)."""
    if gain == 1.0:
        return model
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.relay_layer_norm.weight.mul_(gain)
        model.relay_layer_norm.bias.mul_(gain)
    return model


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_pinned_values_batched(fixture, prefix_cache, device):
    """NFE and answer lengths from the outside transcription, without the carry (any device). Checked to
    fail when finished rows stay counted in NFE."""
    model, prompts, _ = fixture
    plain = _run(on(model, device), prompts, prefix_cache=prefix_cache)
    assert plain.nfe == [12, 5, 1, 4] and [len(t) for t in plain.tokens] == [9, 4, 4, 6]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_pinned_values_batched_with_carry(fixture, prefix_cache, device):
    """The same with the relay carry. Checked to fail when the carry of a row that waited is kept, and when
    finished rows stay counted in NFE. (With MASK left among the candidates the reference gives NFE
    [7, 4, 42, 24] and production, on this random model, stalls committing MASK.)"""
    if device.type != "cpu":
        pytest.skip(ON_CPU_ONLY)
    model, prompts, _ = fixture
    carry = _run(model, prompts, prefix_cache=prefix_cache, relay_carry=True)
    assert carry.nfe == [7, 4, 6, 34] and [len(t) for t in carry.tokens] == [12, 15, 10, 63]


def test_pinned_values_one_at_a_time(fixture, device):
    """One prompt per batch with the carry: the last one never commits the stop token, so it runs the
    authors' 4 blocks and keeps the next block's first token (83 = 4 * 32 + 1 - 46). Fails with a per-row
    block count (96 tokens) or without that last token (82)."""
    if device.type != "cpu":
        pytest.skip(ON_CPU_ONLY)
    model, prompts, _ = fixture
    outs = [_run(model, [p], relay_carry=True) for p in prompts]
    assert [o.nfe[0] for o in outs] == [26, 8, 1, 45]
    assert [len(o.tokens[0]) for o in outs] == [46, 30, 4, 83]
    assert [o.stopped[0] for o in outs] == [True, True, True, False]


# mixed lengths: 64 fills two blocks (its first answer token is autoregressive), 96 ends exactly at a block
# boundary while a longer prompt is in the batch (its first answer position is decoded by the threshold
# rule), 128 is the longest, 70 starts mid-block
LENGTHS = ((47, 56, 75, 46), (64, 96, 70, 128), (5, 40))


def _prompts(lengths):
    g = torch.Generator().manual_seed(sum(lengths))
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("relay_carry, gain", [(False, 1.0), (True, 1.0), (True, RELAY_GAIN)])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_equals_the_plain_reference(fixture, lengths, relay_carry, gain, prefix_cache, device):
    """Tokens, NFE and stop flags equal the no-cache transcription (run on the CPU), batched with mixed
    prompt lengths; the carry at the fixture's relay gain (CPU only: chaotic) and at RELAY_GAIN.
    Checked to fail when: the carry is kept for rows that waited; the AR token is written for a row whose
    prompt ends at a block boundary while a longer prompt remains; finished rows stay counted in NFE."""
    if relay_carry and gain == 1.0 and device.type != "cpu":
        pytest.skip(ON_CPU_ONLY)
    model, _, pad_id = fixture
    model = scaled_relay(model, gain)
    prompts = _prompts(lengths)
    out = _run(on(model, device), prompts, relay_carry=relay_carry, prefix_cache=prefix_cache, max_new_tokens=64)
    tails, nfe, finished = reference_decode(model, prompts, 64, 0.5, STOP_ID, pad_id, relay_carry=relay_carry)
    assert out.nfe == nfe
    assert out.stopped == finished
    assert out.tokens == [t[:t.index(STOP_ID)] if f else t for t, f in zip(tails, finished)]


def test_reference_cases_are_exercised(fixture, device):
    """The mixed-length cases above must contain finished and unfinished rows and threshold commits of
    several tokens, or the equality would test little."""
    model, _, pad_id = fixture
    model = on(model, device)
    stopped, multi = set(), False
    for lengths in LENGTHS:
        out = _run(model, _prompts(lengths), relay_carry=True, max_new_tokens=64, trace=True)
        stopped |= set(out.stopped)
        multi |= any(c > 1 for t in out.trace for c in t["committed"])
    assert stopped == {True, False} and multi


def test_batching_changes_the_carry_decoding(fixture, device):
    """The authors' carry is batch-level: a row's decoding depends on its batch (pinned: 45 NFE alone vs 34
    batched for the last prompt); batch_invariant keeps the one-by-one result."""
    model, prompts, _ = fixture
    model = on(model, device)
    batched = _run(model, prompts, relay_carry=True, decode="batch_invariant")
    alone = [_run(model, [p], relay_carry=True, decode="batch_invariant").nfe[0] for p in prompts]
    assert batched.nfe == alone
    assert _run(model, prompts, relay_carry=True).nfe != alone


def test_sub_block_cache_partial_forwards_exact_for_one_layer(device):
    """In a 1-layer model without relay a position's keys depend on its own token only, so the partial
    sub-block forwards (the 8 positions written in place) must reproduce full decoding. Checked to fail
    when a partial forward is taken while the sub-block's first position is still MASK in some row."""
    tok = frozen_tiny_tokenizer()
    prompts = [tok(t)["input_ids"] for t in PROMPTS]
    config = frozen_tiny_model().config
    config.num_hidden_layers, config.use_relay = 1, False
    torch.manual_seed(0)
    model = FastDLLM(Qwen2ForCausalLM(config)).double().to(device).eval()
    dual = _run(model, prompts, sub_block_cache=True, trace=True)
    plain = _run(model, prompts, trace=True)
    assert dual.tokens == plain.tokens and dual.nfe == plain.nfe
    keys = [(t["block"], t["sub_block"]) for t in dual.trace]
    assert len(keys) > len(set(keys))  # some sub-block took several forwards, so partial forwards ran


def test_stop_from_the_cache_update_forward_does_not_finish(device):
    """ScriptedBlockModel stand-in (block 8, sub-block 4): the stop token sits at position 24, a block start, so the
    cache-update forward chooses it. The row must go on (NFE counting) to the block limit
    (40 // 8 + 3 // 8 = 5 blocks), keep the stop token inside its answer and the next block's first token
    (41 - 3 = 38 tokens). Fails if the AR stop finishes the row (batch_invariant stops at 21 tokens)."""
    model = ScriptedBlockModel(stop_at=24).to(device)  # generate() decodes on its device, the reference on the CPU
    out = generate(model, [[5] * 3], max_new_tokens=40, threshold=0.85, sub_block_size=4, block_size=8)
    tails, nfe, finished = reference_decode(model, [[5] * 3], 40, 0.85, BLOCK_STOP, -1, sub_block_size=4)
    assert out.stopped == [False] == finished
    assert len(out.tokens[0]) == 41 - 3 and out.tokens[0][24 - 3] == BLOCK_STOP
    assert out.tokens == tails and out.nfe == nfe
    early = generate(model, [[5] * 3], max_new_tokens=40, threshold=0.85, sub_block_size=4, block_size=8,
                     decode="batch_invariant")
    assert early.stopped == [True] and len(early.tokens[0]) == 21 and early.nfe[0] < out.nfe[0]


def test_committed_stop_finishes_and_nfe_stops_counting(device):
    """ScriptedBlockModel stop at position 21 (mid-block, committed by the threshold rule): the row finishes there;
    the forwards that finish its block are not counted. By hand: positions 3..21 are decoded with
    threshold 0.85 in sub-blocks of 4; the forward that commits 21 is the last counted one."""
    model = ScriptedBlockModel(stop_at=21).to(device)
    out = generate(model, [[5] * 3], max_new_tokens=40, threshold=0.85, sub_block_size=4, block_size=8, trace=True)
    tails, nfe, finished = reference_decode(model, [[5] * 3], 40, 0.85, BLOCK_STOP, -1, sub_block_size=4)
    assert out.stopped == [True] == finished and out.nfe == nfe
    assert len(out.tokens[0]) == 21 - 3
    assert out.forwards > out.nfe[0]  # the rest of the stop's block was decoded without being counted


class TwoStops(ScriptedBlockModel):
    """The scripted stand-in with a second, confident stop token at position 29 (committed by the threshold
    rule) after the autoregressive one at 24."""

    def forward(self, input_ids, relay_h=None, attention_mask=None, position_ids=None, past_key_values=None):
        out = super().forward(input_ids, relay_h, attention_mask, position_ids, past_key_values)
        for k, q in enumerate(position_ids[0].tolist()):
            if q + 1 == 29:
                out.logits[:, k] = torch.full((out.logits.shape[-1],), -10.0, device=input_ids.device).index_fill(
                    0, torch.tensor([BLOCK_STOP], device=input_ids.device), 10.0)
        return out


def test_answer_ends_at_the_first_stop_even_if_chosen_autoregressively(device):
    """The row finishes at the committed stop (29) but, as the authors pad after the first stop token of
    the answer, its answer ends at the autoregressive one (24): 24 - 3 = 21 tokens. Fails if the answer is
    cut at the stop that finished the row (26 tokens)."""
    model = TwoStops(stop_at=24).to(device)
    out = generate(model, [[5] * 3], max_new_tokens=40, threshold=0.85, sub_block_size=4, block_size=8)
    tails, nfe, finished = reference_decode(model, [[5] * 3], 40, 0.85, BLOCK_STOP, -1, sub_block_size=4)
    assert out.stopped == [True] == finished and out.nfe == nfe
    assert len(out.tokens[0]) == 21 and out.tokens[0] == tails[0][:21]
