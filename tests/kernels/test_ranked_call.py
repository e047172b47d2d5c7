"""`kernels.ranked_call` (a ranked tree policy's call as one Triton kernel) against its reference,
the PyTorch body of `policies.shapes._ranked_call`: the same history and next frontier, bit for
bit, on random calls whose scores tie, hold -inf and NaN (ties to the lower index, as the
reference's stable sort), and clear errors outside the kernel's sizes."""

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.kernels.ranked_call import MAX_WIDTH, ranked_call_triton
from specdec.policies.shapes import _ranked_call

from tree_cases import DEVICE, ci_examples

# a few values drawn again and again so that scores tie; NaN and +inf as a drafter might hand them
LOGQ = (0.0, -0.5, -1.25, -3.0, -7.5, float("-inf"), float("nan"), float("inf"), 0.25)
FRONTIER = (0.0, -0.5, -1.25, -2.0, float("-inf"))


@st.composite
def calls(draw):
    B, F, K = draw(st.integers(1, 3)), draw(st.integers(1, 10)), draw(st.integers(1, 10))
    width = draw(st.integers(1, min(F * K, 16)))
    rng = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    pick = lambda palette, shape: torch.tensor(palette)[torch.randint(len(palette), shape, generator=rng)]  # noqa: E731
    logq = pick(LOGQ, (B, F, K))
    if draw(st.booleans()):  # continuous values too, not only the palette's
        logq = torch.where(torch.rand(B, F, K, generator=rng) < 0.5, logq, -torch.rand(B, F, K, generator=rng) * 5)
    return dict(fr_score=pick(FRONTIER, (B, F)), logq=logq, tokens=torch.randint(0, 50000, (B, F, K), generator=rng),
                fr_hist=torch.randint(0, 500, (B, F), generator=rng), width=width, offset=draw(st.integers(0, 300)), K=K)


def _run(case, impl):
    args = [case[k].to(DEVICE) for k in ("fr_score", "logq", "tokens", "fr_hist")]
    return _ranked_call(*args, case["width"], case["offset"], case["K"], impl=impl)


@pytest.mark.gpu
@ci_examples(60, gpu=500)
@given(calls())
def test_kernel_equals_the_policys_pytorch_call(case):
    note(case)
    out, ref = _run(case, "triton"), _run(case, "ref")
    names = ("score", "flat tokens", "parents", "next tokens", "next scores", "next history", "next rows")
    for name, a, b in zip(names, out, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
        torch.testing.assert_close(a, b, atol=0, rtol=0, equal_nan=True, msg=name)


@pytest.mark.gpu
def test_ties_go_to_the_lower_index_and_nan_ranks_last():
    logq = torch.tensor([[[-1.0, float("nan"), -1.0, float("-inf")], [-0.5, -1.0, float("-inf"), -0.5]]])
    case = dict(fr_score=torch.tensor([[0.0, -0.5]]), logq=logq, tokens=torch.arange(8).view(1, 2, 4),
                fr_hist=torch.tensor([[3, 4]]), width=8, offset=10, K=4)
    _, _, _, tok, score, hist, row = _run(case, "triton")
    # scores: row 0: -1, nan, -1, -inf; row 1: -1, -1.5, -inf, -1 -> order by score, then index
    assert tok.tolist() == [[0, 2, 4, 7, 5, 1, 3, 6]]
    assert hist.tolist() == [[10, 12, 14, 17, 15, 11, 13, 16]] and row.tolist() == [[0, 0, 1, 1, 1, 0, 0, 1]]
    assert score[0, :5].tolist() == [-1.0, -1.0, -1.0, -1.0, -1.5]


def test_sizes_outside_the_kernel_are_clear_errors():
    case = dict(fr_score=torch.zeros(1, 9), logq=torch.zeros(1, 9, 9), tokens=torch.zeros(1, 9, 9, dtype=torch.int64),
                fr_hist=torch.zeros(1, 9, dtype=torch.int64), width=MAX_WIDTH + 1, offset=0, K=9)
    with pytest.raises(ValueError, match=rf"width={MAX_WIDTH + 1} must be at most {MAX_WIDTH}"):
        _run(case, "triton")
    assert _run(case, "auto")[3].shape == (1, MAX_WIDTH + 1)  # "auto" falls back to the PyTorch body
    with pytest.raises(ValueError, match=r"width=0 must be in \[1, 64\] and F \* K = 81"):
        ranked_call_triton(*(case[k].to(DEVICE) for k in ("fr_score", "logq", "tokens", "fr_hist")), 0, 0)


@pytest.mark.gpu
def test_the_kernel_launches_through_a_custom_op_that_compiled_pieces_call_whole():
    """torch.compile must call one registered op, not trace the launcher (the top-k launcher's
    lesson: a plain function inside a compiled piece broke every compiled tree test on the H200)."""
    case = dict(fr_score=torch.zeros(2, 3), logq=-torch.arange(24.0).view(2, 3, 4) / 7,
                tokens=torch.arange(24).view(2, 3, 4), fr_hist=torch.arange(6).view(2, 3), width=5, offset=2, K=4)
    got = torch.ops.specdec.ranked_call.default(*(case[k].to(DEVICE) for k in ("fr_score", "logq", "tokens", "fr_hist")),
                                               5, 2)
    for a, b in zip(got, _run(case, "ref")):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
