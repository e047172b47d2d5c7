"""The token draw rule: the Triton helper `sample_row` equals `sample_index_ref`, including
the fallbacks (threshold past the total, every weight masked away) and block boundaries."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given
from hypothesis import strategies as st

from specdec.kernels.sample_rule import sample_index_ref, sample_row
from tree_cases import DEVICE


@triton.jit
def _sample_rows_kernel(w_ptr, thr_ptr, masked_ptr, out_ptr, V, K, MASK: tl.constexpr, BLOCK_V: tl.constexpr):
    """Row r: draw from w[r] with threshold thr[r]; with MASK, tokens masked[r, :K] are zeroed
    (passed as a sibling list 0 -> 1 -> ... -> K-1, the way the verifier walks children)."""
    r = tl.program_id(0).to(tl.int64)
    first = tl.where(K > 0, 0, -1).to(tl.int64)
    toks = masked_ptr + r * 2 * (K + 1)
    t = sample_row(w_ptr + r * V, tl.load(thr_ptr + r), V, toks, toks + K + 1, first, K, MASK, BLOCK_V)
    tl.store(out_ptr + r, t)


def kernel_draw(w: torch.Tensor, thr: torch.Tensor, masked: torch.Tensor | None, block: int) -> torch.Tensor:
    R, V = w.shape
    K = 0 if masked is None else masked.shape[1]
    # [R, 2(K+1)]: tokens then sibling links of a chain of K "children" (padded by one slot)
    lists = torch.full((R, 2 * (K + 1)), -1, dtype=torch.int64, device=w.device)
    if K:
        lists[:, :K] = masked
        lists[:, K + 1 : 2 * K] = torch.arange(1, K, device=w.device)
    out = torch.empty(R, dtype=torch.int64, device=w.device)
    _sample_rows_kernel[(R,)](w.contiguous(), thr.contiguous(), lists, out, V, K, MASK=masked is not None, BLOCK_V=block)
    return out


def torch_draw(w: torch.Tensor, thr: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
    if masked is None:
        return sample_index_ref(w, thr)
    ww = w.scatter(1, masked, 0.0)
    return sample_index_ref(ww, thr, base=w)


def test_fixed_cases_of_the_rule():
    w = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0, 0.0]], dtype=torch.float64, device=DEVICE).expand(7, 6).contiguous()
    thr = torch.tensor([0.0, 0.2499, 0.25, 0.9, 1 - 2**-53, 1.0, 5.0], dtype=torch.float64, device=DEVICE)
    want = [1, 1, 3, 3, 3, 3, 3]  # thr >= total: the last positive weight
    assert torch_draw(w, thr, None).tolist() == want
    for block in (2, 4, 8):
        assert kernel_draw(w, thr, None, block).tolist() == want


def test_when_every_positive_weight_is_masked_the_rule_falls_back_to_the_base_row():
    w = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64, device=DEVICE)
    masked = torch.tensor([[1, 2], [0, 3]], device=DEVICE)
    thr = torch.tensor([0.3, 0.3], dtype=torch.float64, device=DEVICE)
    assert torch_draw(w, thr, masked).tolist() == [2, 0]
    assert kernel_draw(w, thr, masked, 2).tolist() == [2, 0]


@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(1, 40),
    block=st.sampled_from([2, 8, 64]),
    masked=st.integers(0, 3),
    past_total=st.booleans(),
)
def test_kernel_draw_equals_reference_draw(seed, vocab, block, masked, past_total):
    g = torch.Generator().manual_seed(seed)
    R = 16
    w = torch.rand(R, vocab, generator=g, dtype=torch.float64)
    w[torch.rand(R, vocab, generator=g) < 0.4] = 0.0
    thr = torch.rand(R, generator=g, dtype=torch.float64) * w.sum(-1) * (1.5 if past_total else 1.0)
    toks = torch.randint(0, vocab, (R, masked), generator=g) if masked else None
    w, thr = w.to(DEVICE), thr.to(DEVICE)
    toks = None if toks is None else toks.to(DEVICE)
    assert torch.equal(kernel_draw(w, thr, toks, block), torch_draw(w, thr, toks))


@pytest.mark.parametrize("vocab", [1, 5])
def test_an_all_zero_row_draws_token_zero(vocab):
    w = torch.zeros(2, vocab, dtype=torch.float64, device=DEVICE)
    thr = torch.zeros(2, dtype=torch.float64, device=DEVICE)
    assert torch_draw(w, thr, None).tolist() == [0, 0]
    assert kernel_draw(w, thr, None, 4).tolist() == [0, 0]
