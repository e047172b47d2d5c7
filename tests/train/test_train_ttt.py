"""Training-time test: the mask is the paper's, the fast attention equals the dense reference,
and the unrolled steps compute exactly what the drafter computes at inference."""

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.config import SpecConfig
from specdec.drafters.eagle3_drafter import Eagle3Drafter
from specdec.step_state import StepState
from specdec.train.ttt import estimated_accept_length, ttt_attention, ttt_attention_ref, ttt_mask, ttt_unroll

from _eagle3_heads import D_T, V, VD, World, random_head


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add contention
    yield
    torch.set_num_threads(n)


def test_ttt_mask_is_causal_over_step_zero_plus_the_diagonal_of_later_steps():
    # columns: step 0 rows 0..2 | step 1 rows 0..2 | step 2 rows 0..2
    expected = torch.tensor(
        [
            [1, 0, 0, 1, 0, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(ttt_mask(3, 2), expected)
    assert torch.equal(ttt_mask(3, 0), expected[:, :3])
    with pytest.raises(ValueError, match="step"):
        ttt_mask(3, -1)


@given(T=st.integers(1, 19), step=st.integers(0, 4), hkv=st.sampled_from([1, 2]), groups=st.sampled_from([1, 3]),
       seed=st.integers(0, 2**16))
def test_fast_ttt_attention_equals_the_dense_masked_reference(T, step, hkv, groups, seed):
    note(f"T={T} step={step} Hkv={hkv} G={groups}")
    gen = torch.Generator().manual_seed(seed)
    B, hd = 2, 8
    q = torch.randn(B, T, hkv * groups, hd, generator=gen, dtype=torch.float64)
    keys = [torch.randn(B, T, hkv, hd, generator=gen, dtype=torch.float64) for _ in range(step + 1)]
    values = [torch.randn(B, T, hkv, hd, generator=gen, dtype=torch.float64) for _ in range(step + 1)]
    fast = ttt_attention(q, keys, values, 0.35)
    ref = ttt_attention_ref(q, keys, values, 0.35)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layers", [1, 2], ids=["one-layer", "two-layers"])
def test_ttt_steps_reproduce_the_drafters_chain_at_inference(layers):
    """Row t of TTT step k == draft depth k+1 after a prompt ending at t, when the sequence
    continues with the drafter's own chain (what acceptance of every draft means); a head of
    two draft layers too (each layer's keys grow on their own in the unroll and the cache)."""
    D, L = 5, 12
    head = random_head(seed=1, dtype=torch.float64, num_layers=layers)
    embed = torch.nn.Embedding(V, D_T).to(torch.float64)
    torch.nn.init.normal_(embed.weight, generator=torch.Generator().manual_seed(7))
    cfg = SpecConfig(drafter="eagle3", max_draft_len=D, max_batch_size=1, max_seq_len=64, kv_block_size=4)
    drafter = Eagle3Drafter(head, cfg, embed=embed)
    world = World(L + D + 4, 3 * D_T, seed=3, dtype=torch.float64)
    with torch.no_grad():
        drafter.prefill(0, *world.prefill_args(L))  # prompt seq[:L], first generated token seq[L]
        seen = []
        hook = head.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
        tree = drafter.propose(StepState.for_drafting(
            root_tokens=world.seq[L : L + 1], committed_len=torch.tensor([L]), accept_length=torch.tensor([-1]),
            accept_tokens=torch.full((1, D + 1), -1), active=torch.tensor([True]), drafter=drafter,
        ))
        hook.remove()
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 3, 4]
    chain = tree.tokens[0, 1:]  # [D] target ids, drafts of depth 1..D
    draft_logits = [drafter.root_logits[0]] + [x[0, 0] for x in seen]  # depth 1..D distributions
    assert len(draft_logits) == D

    seq = torch.cat([world.seq[: L + 1], chain])[None]  # [1, T]
    T = seq.shape[1]
    captured = world.H[:T][None]  # rows > L-1 never reach row L-1 of any step
    seen = []
    hook = head.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with torch.no_grad():
        ttt_unroll(
            head, embed, captured, seq, torch.zeros(1, T, VD, dtype=torch.float64), torch.zeros(1, T, dtype=torch.int64),
            torch.ones(1, T), torch.ones(1, T, dtype=torch.bool), steps=D,
        )
    hook.remove()
    for k in range(D):
        torch.testing.assert_close(seen[k][0, L - 1], draft_logits[k].to(torch.float64), rtol=1e-9, atol=1e-9)


def test_ttt_loss_masks_out_of_vocabulary_targets_and_weights_steps():
    head = random_head(seed=2)
    embed = torch.nn.Embedding(V, D_T)
    B, T = 2, 10
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    captured = torch.randn(B, T, 3 * D_T, generator=gen)
    logits = torch.randn(B, T, VD, generator=gen)
    outside = (~head.t2d).nonzero()[0, 0]
    argmax = torch.full((B, T), int(outside))  # every target outside the draft vocabulary
    res = ttt_unroll(head, embed, captured, tokens, logits, argmax, torch.ones(B, T), torch.ones(B, T, dtype=torch.bool), steps=3)
    assert float(res.loss.detach()) == 0.0 and res.weight.sum() == 0  # all masked out of the loss
    assert res.count.tolist() == [2 * 8, 2 * 7, 2 * 6] and res.correct.sum() == 0  # but counted as misses
    inside = head.target_ids()[0]
    res = ttt_unroll(head, embed, captured, tokens, logits, torch.full((B, T), int(inside)), torch.ones(B, T),
                     torch.ones(B, T, dtype=torch.bool), steps=3, step_weight=0.5)
    expected = sum(0.5**k * res.step_loss[k] for k in range(3))
    torch.testing.assert_close(res.loss.detach(), expected)
    res.loss.backward()
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0


def test_estimated_accept_length_is_one_plus_the_running_products():
    assert estimated_accept_length([0.5, 0.5, 1.0], depth=3) == pytest.approx(1 + 0.5 + 0.25 + 0.25)
    assert estimated_accept_length([1.0] * 7, depth=5) == 6.0
