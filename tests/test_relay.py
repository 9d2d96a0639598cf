import textwrap
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, SudokuTransformer
from sudoku.board import MASK
from relay import (RelayLayerNorm, check_step_fn, RolloutBuffer, block_confidence_unmask, confidence_unmask, draw_taus,
                   masked_ce, mlm_loss, mlm_masking, rollout_loss)

V = 17
SMALL = dict(n_layer=2, n_head=4, n_embd=32, d_ff=64, dropout=0.0)


def policies(K: int, tau: float = 0.15, sigma: float = 0.1, generator=None) -> list:
    """The paper's training policy for a K-step window: confidence_unmask at one drawn threshold per step."""
    return [partial(confidence_unmask, tau=t) for t in draw_taus(K, tau, sigma, generator)]


def logits_with_confidence(conf: torch.Tensor, top: int = 9) -> torch.Tensor:
    """Logits (..., V) whose softmax max-probability is exactly conf, at token `top`."""
    rest = ((1 - conf) / (V - 1)).log()
    out = rest.unsqueeze(-1).repeat(*([1] * conf.dim()), V)
    out[..., top] = conf.log()
    return out


def reference_confidence_unmask(logits, candidates, tau):
    """Row-by-row loop version of the confidence rule, written independently of the vectorised one."""
    conf = logits.float().softmax(-1).amax(-1)
    out = torch.zeros_like(candidates)
    for b in range(len(conf)):
        cells = [i for i in range(conf.shape[1]) if candidates[b, i]]
        cells.sort(key=lambda i: 1 - conf[b, i].item())
        total = 0.0
        for i in cells:
            total += 1 - conf[b, i].item()
            if total < tau:
                out[b, i] = True
        if cells and not out[b].any():
            out[b, max(cells, key=lambda i: conf[b, i].item())] = True
    return out


def test_inclusive_cumsum_commits_exactly_one():
    logits = logits_with_confidence(torch.tensor([[0.9, 0.9, 0.9, 0.3]]))  # u = 0.1, 0.1, 0.1, 0.7
    cand = torch.ones(1, 4, dtype=torch.bool)
    assert confidence_unmask(logits, cand, 0.15).sum() == 1  # xlm-core's exclusive rule would commit 2
    assert confidence_unmask(logits, cand, 0.25).sum() == 2
    assert confidence_unmask(logits, cand, 0.35).sum() == 3
    assert confidence_unmask(logits, cand, 1.05).sum() == 4


def test_nothing_qualifies_forces_most_confident():
    logits = logits_with_confidence(torch.tensor([[0.2, 0.6, 0.4, 0.99]]))
    cand = torch.tensor([[True, True, True, False]])  # the most confident cell is not a candidate
    out = confidence_unmask(logits, cand, 0.15)
    assert out.tolist() == [[False, True, False, False]]
    assert confidence_unmask(logits, cand, 0.0).tolist() == [[False, True, False, False]]  # tau 0: one per step


def test_non_candidates_never_selected_and_done_rows_select_nothing():
    logits = logits_with_confidence(torch.tensor([[0.999, 0.999, 0.5], [0.999, 0.999, 0.999]]))
    cand = torch.tensor([[False, True, True], [False, False, False]])
    out = confidence_unmask(logits, cand, 10.0)
    assert out.tolist() == [[False, True, True], [False, False, False]]


def test_confidence_unmask_matches_row_loop(device):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 81, V, generator=g) * 4
    cand = torch.rand(16, 81, generator=g) < 0.6
    cand[3] = False
    on = (logits.to(device), cand.to(device))  # the vectorised rule on the device, the loop on the CPU
    for tau in (0.0, 0.05, 0.15, 0.5, 3.0):
        assert torch.equal(confidence_unmask(*on, tau).cpu(), reference_confidence_unmask(logits, cand, tau))
    taus = torch.rand(16, generator=g)  # one tau per row
    out = confidence_unmask(*on, taus.to(device)).cpu()
    for b in range(16):
        assert torch.equal(out[b], reference_confidence_unmask(logits[b:b + 1], cand[b:b + 1], taus[b].item())[0])


def test_block_confidence_unmask():
    conf = torch.tensor([[0.9, 0.5, 0.3, 0.95, 0.4, 0.2, 0.99, 0.1]])
    cand = torch.tensor([[True, True, True, False, False, False, False, True]])
    out = block_confidence_unmask(logits_with_confidence(conf), cand, threshold=0.85, block_size=3)
    # block 0: 0.9 > 0.85 (also its argmax); block 1: no candidates; block 2 (6, 7): argmax = cell 7
    assert out.tolist() == [[True, False, False, False, False, False, False, True]]
    out = block_confidence_unmask(logits_with_confidence(conf), cand, threshold=0.2, block_size=4)
    # block 0: all three candidates exceed 0.2; block 1: cell 7 (0.1) is below it but is its block's argmax
    assert out.tolist() == [[True, True, True, False, False, False, False, True]]


def test_drawn_thresholds_give_one_policy_per_step(device):
    """draw_taus(2, 0.15, 0.1, g) gives one threshold per step, max(0, 0.15 + 0.1 eps) for the generator's
    successive draws (computed by hand here), and the policy of step k commits as confidence_unmask at
    its threshold, on the device; sigma = 0 gives the fixed threshold. Checked: fails when draw_taus
    reuses one draw for every step, and when it drops the perturbation (tau alone)."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 81, V, generator=g) * 4).to(device)
    cand = torch.ones(4, 81, dtype=torch.bool, device=device)  # tau is drawn on the CPU generator
    fixed = policies(1, 0.15, sigma=0.0)[0]
    assert torch.equal(fixed(logits, cand), confidence_unmask(logits, cand, 0.15))
    steps = policies(2, 0.15, 0.1, torch.Generator().manual_seed(1))
    eps = torch.randn(2, generator=torch.Generator().manual_seed(1))
    assert eps[0] != eps[1]
    for policy, e in zip(steps, eps):
        expected = confidence_unmask(logits, cand, max(0.0, 0.15 + 0.1 * e.item()))
        assert torch.equal(policy(logits, cand), expected)


def test_masked_ce_token_mean_and_ddp_normalisation(device):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 81, V, generator=g, dtype=torch.float64)
    x0 = torch.randint(8, 17, (6, 81), generator=g)
    mask = torch.rand(6, 81, generator=g) < 0.3
    expected = F.cross_entropy(logits[mask], x0[mask]).float()  # float64 on the CPU
    logits, x0, mask = logits.float().to(device), x0.to(device), mask.to(device)
    torch.testing.assert_close(masked_ce(logits, x0, mask).cpu(), expected)
    # two "ranks" whose losses are normalised by the mean count average to the global token mean
    mean_count = lambda n: mask.sum().float() / 2  # noqa: E731
    halves = [masked_ce(logits[s], x0[s], mask[s], mean_count) for s in (slice(0, 2), slice(2, 6))]
    torch.testing.assert_close(((halves[0] + halves[1]) / 2).cpu(), expected)
    assert masked_ce(logits, x0, torch.zeros_like(mask)).item() == 0.0


def test_mlm_masking_and_loss(device):
    g = torch.Generator().manual_seed(0)
    clues = (torch.rand(2000, 81, generator=g) < 0.4).to(device)
    masked = mlm_masking(maskable=~clues, generator=g)  # a CPU generator, cells on the device
    assert masked.device == clues.device and not (masked & clues).any()
    frac = masked.sum(1).float() / (~clues).sum(1).float()
    assert 0.45 < frac.mean() < 0.55 and frac.std() > 0.2  # t ~ U(0,1) per puzzle: mean 1/2, wide spread
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL)).to(device)
    x0 = torch.randint(8, 17, (4, 81), generator=g).to(device)
    clues, masked = clues[:4], masked[:4]
    loss = mlm_loss(model, x0, maskable=~clues, mask_id=MASK, masked=masked)
    logits, _ = model(torch.where(masked, MASK, x0))
    torch.testing.assert_close(loss, F.cross_entropy(logits[masked], x0[masked]))  # no 1/t weight


def puzzle_batch(B=8, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(8, 17, (B, 81), generator=g)
    clues = torch.rand(B, 81, generator=g) < 0.4
    return x0.to(device), ~clues.to(device)


class Recorder:
    """Wraps a model as step_fn and keeps every step's inputs and outputs."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, z, h):
        logits, h_out = self.model(z, h)
        self.calls.append((z, h, logits, h_out))
        return logits, h_out


def test_k1_rollout_loss_equals_masked_ce_of_one_forward(device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL, relay=True)).to(device)
    x0, maskable = puzzle_batch(device=device)
    z = torch.where(maskable, MASK, x0)
    out = rollout_loss(model, x0=x0, z=z, maskable=maskable, h=None, mask_id=MASK, K=1, variant="relay",
                       policy=policies(1))
    logits, _ = model(z)
    torch.testing.assert_close(out.loss, F.cross_entropy(logits[maskable], x0[maskable]))


@pytest.mark.parametrize("dtype, stored", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                           (torch.bfloat16, torch.float32)])
def test_loss_and_stored_state_are_never_rounded_down(dtype, stored):
    """The loss is computed, and the relay state stored for the next window, in at least float32: bf16
    goes up, float64 stays (a float64 golden run must not pass through float32, whose 1e-7 errors hid
    inside the float64 comparisons' tolerance and broke them on a GPU). Loss against a float64 hand sum."""
    g = torch.Generator().manual_seed(0)
    B, L, d = 2, 5, 4
    logits = torch.randn(B, L, V, generator=g, dtype=torch.float64)
    h_out = torch.randn(B, L, d, generator=g, dtype=torch.float64)
    step = lambda z, h: (logits.to(dtype), h_out.to(dtype))
    x0 = torch.randint(0, V - 1, (B, L), generator=g)
    maskable = torch.ones(B, L, dtype=torch.bool)
    out = rollout_loss(step, x0=x0, z=torch.full((B, L), V - 1), maskable=maskable, h=None, mask_id=V - 1, K=1,
                       variant="relay", policy=policies(1))
    assert out.h.dtype == stored and torch.equal(out.h, h_out.to(dtype).to(stored))
    want = -logits.to(dtype).double().log_softmax(-1).gather(-1, x0[..., None]).mean()
    assert out.loss.dtype == stored
    assert abs(float(out.loss) - float(want)) < (1e-12 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("variant", ["relay", "relay_sg", "rollout"])
def test_gradient_paths_across_steps(variant, device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL, relay=variant != "rollout")).to(device)
    with torch.no_grad():  # a non-trivial incoming state
        h0 = torch.randn(8, 81, 32).to(device)
    x0, maskable = puzzle_batch(device=device)
    rec = Recorder(model)
    z = torch.where(maskable, MASK, x0)
    rollout_loss(rec, x0=x0, z=z, maskable=maskable, h=h0 if variant != "rollout" else None, mask_id=MASK, K=2,
                 variant=variant, policy=policies(2))
    (z1, h1_in, _, h1_out), (z2, h2_in, logits2, _) = rec.calls
    loss2 = masked_ce(logits2, x0, (z2 == MASK) & maskable)
    assert h1_in is None or not h1_in.requires_grad  # the stored state never carries a graph
    if variant == "rollout":
        assert h1_in is None and h2_in is None  # no relay path at all
        return
    g_h1, g_gamma = torch.autograd.grad(loss2, [h1_out, model.relay_norm.weight], allow_unused=True,
                                        retain_graph=True)
    if variant == "relay":
        assert h2_in is h1_out
        assert g_h1 is not None and g_h1.abs().sum() > 0
        # the relay LN's gradient has a part that flows through step 1 (it is applied there too)
        sg_logits, _ = model(z2, h1_out.detach())
        g_sg = torch.autograd.grad(masked_ce(sg_logits, x0, (z2 == MASK) & maskable), model.relay_norm.weight)[0]
        assert (g_gamma - g_sg).abs().max() > 1e-7
    else:
        assert torch.equal(h2_in, h1_out.detach())
        assert g_h1 is None  # no gradient reaches step 1 from the step-2 loss
        # step 2's gradients equal those of a fresh forward on (z2, h1): nothing flows into step 1
        params = [p for p in model.parameters()]
        g_roll = torch.autograd.grad(loss2, params, allow_unused=True)
        ref_logits, _ = model(z2, h1_out.detach())
        g_ref = torch.autograd.grad(masked_ce(ref_logits, x0, (z2 == MASK) & maskable), params, allow_unused=True)
        for a, b in zip(g_roll, g_ref):
            torch.testing.assert_close(a, b)


def test_rollout_never_changes_clues_or_committed_cells_and_teacher_forces(device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL, relay=True)).to(device).eval()
    x0, maskable = puzzle_batch(device=device)
    buf = RolloutBuffer(8, MASK)
    buf.refill(x0, maskable)
    prev = buf.z.clone()
    for _ in range(41):  # <= 81 cells, >= 2 per window
        with torch.no_grad():
            out = rollout_loss(model, **buf.inputs(), K=2, variant="relay", policy=policies(2, 0.15, 0.0))
            buf.update(out)
        revealed = prev != MASK
        assert torch.equal(out.z[revealed], prev[revealed])  # nothing committed ever changes
        assert torch.equal(out.z[~maskable], x0[~maskable])  # clues stay
        now = out.z != MASK
        assert torch.equal(out.z[now], x0[now])  # every revealed cell holds the true token
        left_before, left_after = (prev == MASK).sum(1), (out.z == MASK).sum(1)
        assert torch.all(left_before - left_after >= left_before.clamp(max=2))  # >= 1 cell per row per step
        prev = out.z.clone()
    assert buf.finished().all()


def test_buffer_refills_only_finished_slots(device):
    x0, maskable = puzzle_batch(B=6, seed=0, device=device)
    buf = RolloutBuffer(6, MASK)
    assert buf.refill(x0, maskable) == 6
    assert torch.equal(buf.z, torch.where(maskable, MASK, x0))  # cold: every maskable cell masked
    buf.h = torch.randn(6, 81, 4).to(device)
    h_before, z_before = buf.h.clone(), buf.z.clone()
    buf.z[[1, 4]] = buf.x0[[1, 4]]  # slots 1 and 4 finish
    new_x0, new_maskable = puzzle_batch(B=6, seed=1, device=device)
    assert buf.refill(new_x0, new_maskable) == 2
    assert torch.equal(buf.x0[[1, 4]], new_x0[:2]) and torch.equal(buf.maskable[[1, 4]], new_maskable[:2])
    assert torch.equal(buf.z[[1, 4]], torch.where(new_maskable[:2], MASK, new_x0[:2]))
    assert torch.all(buf.h[[1, 4]] == 0)
    keep = [0, 2, 3, 5]
    assert torch.equal(buf.z[keep], z_before[keep]) and torch.equal(buf.h[keep], h_before[keep])
    assert buf.refill(new_x0, new_maskable) == 0
    state = {k: v.clone() for k, v in buf.state_dict().items()}
    other = RolloutBuffer(6, MASK)
    other.load_state_dict(state)
    assert other.finished().tolist() == buf.finished().tolist() and torch.equal(other.h, buf.h)


def test_staggered_buffer_starts_at_random_points(device):
    x0, maskable = puzzle_batch(B=64, device=device)
    buf = RolloutBuffer(64, MASK, init="staggered")
    buf.refill(x0, maskable, torch.Generator().manual_seed(0))
    masked = buf.z == MASK
    assert not (masked & ~maskable).any()
    revealed = ~masked & maskable
    assert torch.equal(buf.z[revealed], x0[revealed])
    frac = masked.sum(1).float() / maskable.sum(1).float()
    assert frac.std() > 0.15 and 0.3 < frac.mean() < 0.7
    with pytest.raises(ValueError, match="cold"):
        RolloutBuffer(4, MASK, init="warm")


def test_relay_layernorm_zero_init():
    ln = RelayLayerNorm(8, zero_init=True)
    assert torch.all(ln(torch.randn(3, 8)) == 0)
    assert torch.all(RelayLayerNorm(8).weight == 1)


def test_rollout_loss_input_errors():
    x0, maskable = puzzle_batch()
    state = dict(x0=x0, z=x0, maskable=maskable, h=None, mask_id=MASK)
    with pytest.raises(ValueError, match="variant"):
        rollout_loss(lambda z, h: None, **state, variant="relay2", policy=policies(2))
    with pytest.raises(ValueError, match="empty"):
        rollout_loss(lambda z, h: None, **RolloutBuffer(4, MASK).inputs(), policy=policies(2))
    with pytest.raises(ValueError, match="K must"):
        rollout_loss(lambda z, h: None, **state, K=0, policy=policies(1)[0])


def test_masked_ce_large_vocabulary_path_agrees():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 2000, generator=g)
    x0 = torch.randint(0, 2000, (2, 7), generator=g)
    mask = torch.rand(2, 7, generator=g) < 0.5
    small = masked_ce(logits[..., :17], x0 % 17, mask)  # the mask-weighted path
    torch.testing.assert_close(small, F.cross_entropy(logits[..., :17][mask], (x0 % 17)[mask]))
    torch.testing.assert_close(masked_ce(logits, x0, mask), F.cross_entropy(logits[mask], x0[mask]))


# ----------------------------------------------------------------------------- traps a user of relay.py falls into

class ToyMDM(torch.nn.Module):
    """A torch-only MDM (embedding, one linear layer, head) with a learned-looking relay (beta != 0)."""

    def __init__(self, V=6, d=8, skip_relay_when_none=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.body, self.head = torch.nn.Embedding(V, d), torch.nn.Linear(d, d), torch.nn.Linear(d, V)
        self.relay_norm = RelayLayerNorm(d)
        torch.nn.init.normal_(self.relay_norm.bias)
        self.skip = skip_relay_when_none

    def forward(self, tokens, h=None, row_id=None):
        x = self.emb(tokens)
        if h is not None or not self.skip:
            x = x + self.relay_norm(torch.zeros_like(x) if h is None else h)
        h_out = torch.tanh(self.body(x))
        return self.head(h_out), h_out


def test_refill_refuses_a_buffer_whose_rollout_was_never_stored():
    """Trap of the state-tensor API: a loop that forgets buffer.update(out) refills nothing (no slot
    finished) and rolls the same window out again, silently. Checked: fails if refill stops checking,
    or if update() stops clearing the flag (the correct loop then raises)."""
    x0 = torch.randint(0, 5, (4, 9))
    maskable = torch.ones(4, 9, dtype=torch.bool)
    buf = RolloutBuffer(4, mask_id=5)
    for _ in range(2):  # the correct loop: refill, roll out, store
        buf.refill(x0, maskable)
        buf.update(rollout_loss(ToyMDM(), **buf.inputs(), K=1, policy=policies(1)))
    rollout_loss(ToyMDM(), **buf.inputs(), K=1, policy=policies(1))  # output dropped
    with pytest.raises(RuntimeError, match="buffer.update"):
        buf.refill(x0, maskable)


def test_mask_id_is_required_and_buffer_and_loss_must_agree():
    """Trap: mask_id defaulted to Sudoku's 2 in three places; a buffer and a loss that disagree gave
    loss 0 and n_masked 0. Checked: fails if RolloutBuffer/mlm_loss/rollout_loss get a default mask_id
    again, or if buffer.inputs() stops supplying the buffer's mask_id (a second mask_id= would then be
    taken silently instead of a TypeError)."""
    x0 = torch.randint(0, 5, (4, 9))
    maskable = torch.rand(4, 9, generator=torch.Generator().manual_seed(0)) < 0.5
    with pytest.raises(TypeError):
        RolloutBuffer(4)
    with pytest.raises(TypeError):
        mlm_loss(ToyMDM(), x0, maskable=maskable)
    buf = RolloutBuffer(4, mask_id=5)
    buf.refill(x0, maskable)
    with pytest.raises(TypeError, match="multiple values for keyword argument 'mask_id'"):
        rollout_loss(ToyMDM(), **buf.inputs(), mask_id=2, policy=policies(2))
    out = rollout_loss(ToyMDM(), **buf.inputs(), K=1, policy=policies(1))  # taken from the buffer
    assert out.n_masked[0] == maskable.sum()
    with pytest.raises(TypeError, match="mask_id"):
        rollout_loss(ToyMDM(), x0=x0, z=x0, maskable=maskable, h=None, policy=policies(2))
    with pytest.raises(ValueError, match="holds mask_id"):  # a real symbol used as the mask id
        RolloutBuffer(4, mask_id=int(x0[maskable][0])).refill(x0, maskable)


def test_one_convention_for_cells_to_fill():
    """Trap: mlm_loss took clues (given cells) and refill took maskable (cells to fill), so one tensor
    passed to both masked the clues. Checked: fails if mlm_loss/mlm_masking accept the mask positionally
    again (an old clues call would run silently inverted) or mask outside maskable."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, 5, (64, 9), generator=g)
    maskable = torch.rand(64, 9, generator=g) < 0.5
    with pytest.raises(TypeError):
        mlm_loss(ToyMDM(), x0, ~maskable, mask_id=5)
    with pytest.raises(TypeError):
        mlm_masking(~maskable)
    masked = mlm_masking(maskable=maskable, generator=g)
    assert masked.any() and not (masked & ~maskable).any()
    buf = RolloutBuffer(64, mask_id=5)
    buf.refill(x0, maskable)
    assert torch.equal(buf.z == 5, maskable)  # the same tensor means the same cells in both
    with pytest.raises(ValueError, match="only maskable"):
        mlm_loss(ToyMDM(), x0, maskable=maskable, mask_id=5, masked=~maskable)


def test_docstring_example_follows_the_h_none_contract():
    """Trap: the example skipped R(h) when h is None, so with beta != 0 a fresh buffer (None) and a
    refilled slot (zeros) started differently. Runs the module docstring's example class on a toy
    backbone with beta != 0. Checked: fails when the example is edited to `if h is not None: x += R(h)`,
    and check_step_fn rejects a step_fn that does so."""
    import relay
    doc = relay.__doc__
    code = doc[doc.index("    class MyRelayMDM"):doc.index("    model = MyRelayMDM")]
    ns = {"nn": torch.nn, "torch": torch, "RelayLayerNorm": RelayLayerNorm}
    exec(textwrap.dedent(code), ns)
    toy = ToyMDM()
    backbone = torch.nn.Module()
    backbone.embed, backbone.layers, backbone.head = toy.emb, torch.nn.Sequential(toy.body, torch.nn.Tanh()), toy.head
    model = ns["MyRelayMDM"](backbone, 8)
    torch.nn.init.normal_(model.relay_norm.bias)  # as after training: R(0) = beta != 0
    tokens = torch.randint(0, 6, (3, 5))
    check_step_fn(model, tokens, d=8)
    with pytest.raises(ValueError, match="h=None and h=zeros"):
        check_step_fn(ToyMDM(skip_relay_when_none=True), tokens, d=8)


def test_wrong_relay_state_and_step_outputs_are_errors():
    """Trap: a wrong dtype/shape of h was used silently (broadcast or cast). Checked: fails if
    _check_state is removed from rollout_loss or from the step-output check."""
    x0 = torch.randint(0, 5, (2, 9))
    maskable = torch.ones(2, 9, dtype=torch.bool)
    z = torch.full_like(x0, 5)
    for bad in (torch.zeros(2, 9), torch.zeros(2, 9, 8, dtype=torch.long), torch.zeros(1, 9, 8)):
        with pytest.raises(ValueError, match="relay state"):
            rollout_loss(ToyMDM(), x0=x0, z=z, maskable=maskable, h=bad, mask_id=5, policy=policies(2))
    state = dict(x0=x0, z=z, maskable=maskable, h=None, mask_id=5, policy=policies(2))
    with pytest.raises(ValueError, match="h_out"):
        rollout_loss(lambda t, h: (ToyMDM()(t)[0], None), **state)
    with pytest.raises(ValueError, match="h_out"):
        rollout_loss(lambda t, h: (ToyMDM()(t)[0], torch.zeros(2, 8)), **state)


def test_buffer_extras_reach_step_fn_in_the_rows_order(device):
    """Trap: per-row extras (e.g. attention_mask) had no way into step_fn, and refill reorders rows.
    Here each row's extra is its id, also written into its tokens; step_fn checks they match after
    refills that put new rows into scattered slots. Checked: fails when refill copies the extras
    without the slot reordering (`extras[k][:size]`)."""
    seen = []

    def step_fn(tokens, h, row_id):
        assert torch.equal(tokens[:, 0], row_id % 5), "extras row order differs from the tokens'"
        seen.append(row_id.clone())
        return ToyMDM().to(tokens.device)(tokens, h)

    g = torch.Generator().manual_seed(0)
    buf = RolloutBuffer(4, mask_id=5)
    for start in range(0, 40, 8):
        row_id = torch.arange(start, start + 8)
        x0 = torch.randint(0, 5, (8, 9), generator=g)
        x0[:, 0] = row_id % 5
        maskable = torch.rand(8, 9, generator=g) < 0.6
        maskable[:, 0] = False
        maskable[torch.arange(8), 1 + torch.arange(8) % 8] = True
        x0, maskable, row_id = x0.to(device), maskable.to(device), row_id.to(device)
        buf.refill(x0, maskable, extras={"row_id": row_id})
        buf.update(rollout_loss(step_fn, **buf.inputs(), K=2, variant="relay", policy=policies(2, 0.3, 0.0)))
    assert len(torch.cat(seen).unique()) > 8  # rows of several refills went through
    with pytest.raises(ValueError, match="extras"):
        buf.refill(x0, maskable)  # the buffer holds extras: a refill without them is an error


def test_relay_py_is_self_contained():
    """Trap: docstrings cited files a user lacks (design notes, LaTeX labels). Checked: fails on the
    old relay.py (\"design note sudoku.md 4.1\", \"Eq. relay_recurrence\") and if relay.py imports
    anything beyond torch and the standard library."""
    import ast
    import relay
    text = open(relay.__file__).read()
    for banned in ("design note", ".md", "relay_recurrence", "relay_two_step", "eq:", "sudoku/board.py", "issue"):
        assert banned not in text, f"relay.py mentions {banned!r}"
    modules = {n.module if isinstance(n, ast.ImportFrom) else a.name
               for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in (n.names if isinstance(n, ast.Import) else [None])}
    assert {m.split(".")[0] for m in modules} <= {"torch", "dataclasses", "typing"}, modules
