"""`specdec.kernels.fused_linear`: the few-row projection with the residual add + RMSNorm
(`norm_linear`, `rms_norm_linear`) or SwiGLU's activation (`swiglu_linear`) fused before it,
against their references (the eager pieces and `F.linear`), on random shapes drawn by hypothesis
and at SmolLM2's shapes; their errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels.fused_linear import (norm_linear_torch, norm_linear_triton, rms_norm_linear_torch,
                                          rms_norm_linear_triton, swiglu_linear_torch, swiglu_linear_triton)
from specdec.kernels.small_linear import MAX_ROWS
from specdec.models.fused import add_rms_norm, rms_norm, silu_mul
from _linear_tiles import few_programs
from tree_cases import DEVICE, FULL

pytestmark = pytest.mark.gpu  # scripts/gpu_check.sh runs it on CUDA

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The fused kernels round each op's result where the eager op rounds it, so in bf16 / fp16 the
# projection's input equals the eager pieces' bit for bit except where the norm's float32 mean (summed
# in another order) moves a value across a rounding boundary: one step of the dtype there. The
# projection then adds the small-linear kernel's error (float32 sums in another order than F.linear,
# rounded once). Bound: a relative float32 term on the sum of |x| |w| (K + 2 ulps of 2^-23, as the
# small-linear test) plus, per dtype, a step of the output (its rounding) and a step of every input
# value (a moved rounding) times |w|.
STEP = {torch.float32: 2.0**-22, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _bound(x_ref: torch.Tensor, w: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    scale = x_ref.double().abs() @ w.double().abs().T  # [M, N]
    K = x_ref.shape[-1]
    step = STEP[x_ref.dtype]
    return scale * ((K + 2) * 2.0**-23 + step) + exact.abs() * step + 1e-30


def _rand(shape, dtype, g, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def _check_norm_linear(m, n, k, dtype, bias, with_delta, seed):
    g = torch.Generator().manual_seed(seed)
    res, delta = _rand((m, k), dtype, g, 2.0), _rand((m, k), dtype, g)
    nw = (1 + 0.2 * torch.randn(k, generator=g)).to(dtype).to(DEVICE)
    w = _rand((n, k), dtype, g, k**-0.5)
    b = _rand((n,), dtype, g) if bias else None
    eps = 1e-5
    if with_delta:
        h, y = norm_linear_triton(res, delta, nw, eps, w, b)
        h_ref, x_ref = add_rms_norm(res, delta, nw, eps)  # the eager pieces the model runs unfused
        assert torch.equal(h, h_ref), "the residual sum is one rounded add, as the eager add"
        h0, y0 = norm_linear_torch(res, delta, nw, eps, w, b)
        assert torch.equal(h0, h_ref)
    else:
        y = rms_norm_linear_triton(res, nw, eps, w, b)
        x_ref = rms_norm(res, nw, eps)
        y0 = rms_norm_linear_torch(res, nw, eps, w, b)
    assert y.shape == (m, n) and y.dtype == dtype
    exact = torch.nn.functional.linear(x_ref.double(), w.double(), None if b is None else b.double())
    bound = _bound(x_ref, w, exact)
    for out in (y, y0):
        err = (out.double() - exact).abs()
        assert bool((err <= bound).all()), f"largest error {err.max().item():.3g} over its bound"


def _check_swiglu_linear(m, n, k, dtype, bias, seed):
    g = torch.Generator().manual_seed(seed)
    gate_up = _rand((m, 2 * k), dtype, g, 2.0)
    w = _rand((n, k), dtype, g, k**-0.5)
    b = _rand((n,), dtype, g) if bias else None
    y = swiglu_linear_triton(gate_up, w, b)
    x_ref = silu_mul(gate_up)
    exact = torch.nn.functional.linear(x_ref.double(), w.double(), None if b is None else b.double())
    bound = _bound(x_ref, w, exact)
    for out in (y, swiglu_linear_torch(gate_up, w, b)):
        assert out.shape == (m, n) and out.dtype == dtype
        err = (out.double() - exact).abs()
        assert bool((err <= bound).all()), f"largest error {err.max().item():.3g} over its bound"


@settings(max_examples=30 if FULL else 15, deadline=None)
@given(m=st.integers(1, MAX_ROWS), n=st.integers(1, 200), k=st.integers(1, 400), dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), with_delta=st.booleans(), seed=st.integers(0, 2**16))
def test_norm_linear_equals_the_eager_norm_then_the_projection(m, n, k, dtype, bias, with_delta, seed):
    with few_programs():
        _check_norm_linear(m, n, k, dtype, bias, with_delta, seed)


@settings(max_examples=30 if FULL else 15, deadline=None)
@given(m=st.integers(1, MAX_ROWS), n=st.integers(1, 200), k=st.integers(1, 400), dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_swiglu_linear_equals_the_eager_activation_then_the_projection(m, n, k, dtype, bias, seed):
    with few_programs():
        _check_swiglu_linear(m, n, k, dtype, bias, seed)


# SmolLM2-135M: qkv and gate/up after a norm over 576; down after SwiGLU over 1536 (CI: one row each).
NORM_SHAPES = [(960, 576), (3072, 576)]
SWIGLU_SHAPES = [(576, 1536)]
ROWS = (1, 6) if FULL else (1,)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n, k", NORM_SHAPES if FULL else NORM_SHAPES[:1])
def test_norm_linear_at_smollm2_shapes_in_bf16(m, n, k):
    with few_programs():
        _check_norm_linear(m, n, k, torch.bfloat16, False, True, n + k + m)


def test_norm_linear_walks_k_in_slices_past_one_slice():
    # 1-2 rows take all of K in one slice up to 1024: a wider K is two slices, both passes
    with few_programs():
        _check_norm_linear(2, 8, 1100, torch.float32, True, True, 5)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n, k", SWIGLU_SHAPES)
def test_swiglu_linear_at_smollm2_shapes_in_bf16(m, n, k):
    with few_programs():
        _check_swiglu_linear(m, n, k, torch.bfloat16, False, n + k + m)


def test_bf16_norm_linear_feeds_the_projection_the_eager_pieces_bits():
    # with a weight of one 1 at column j, y[:, j] is the normed input's column: the kernel's normed
    # rows must be the eager add+norm's, rounded as they round (a wrong rounding step shows here)
    g = torch.Generator().manual_seed(3)
    m, k = 4, 64
    res, delta = _rand((m, k), torch.bfloat16, g, 3.0), _rand((m, k), torch.bfloat16, g)
    nw = (1 + 0.2 * torch.randn(k, generator=g)).to(torch.bfloat16).to(DEVICE)
    eye = torch.eye(k, dtype=torch.bfloat16, device=DEVICE)
    _, y = norm_linear_triton(res, delta, nw, 1e-6, eye, None)
    _, normed = add_rms_norm(res, delta, nw, 1e-6)
    moved = (y != normed).float().mean().item()
    assert moved <= 0.02, f"{moved:.1%} of the normed values differ from the eager pieces'"
    gate_up = _rand((m, 2 * k), torch.bfloat16, g, 3.0)
    assert torch.equal(swiglu_linear_triton(gate_up, eye, None), silu_mul(gate_up))


@pytest.mark.parametrize(
    "call, match",
    [(lambda z: norm_linear_triton(z(2, 8), z(3, 8), z(8), 1e-6, z(4, 8), None), "must have res's shape"),
     (lambda z: norm_linear_triton(z(2, 8), z(2, 8), z(2, 8), 1e-6, z(4, 8), None), r"norm_weight must be \[K\]"),
     (lambda z: norm_linear_triton(z(9, 8), z(9, 8), z(8), 1e-6, z(4, 8), None), "9 rows; allowed: 1 to MAX_ROWS=8"),
     (lambda z: rms_norm_linear_triton(z(2, 8), z(7), 1e-6, z(4, 8), None), "must match the rows"),
     (lambda z: swiglu_linear_triton(z(2, 9), z(4, 8), None), r"must be \[M, 2K\]"),
     (lambda z: swiglu_linear_triton(z(2, 16).double(), z(4, 8).double(), None), "must be one of")],
)
def test_bad_inputs_are_refused_with_the_allowed_values(call, match):
    with pytest.raises(ValueError, match=match):
        call(lambda *shape: torch.zeros(shape, device=DEVICE))
