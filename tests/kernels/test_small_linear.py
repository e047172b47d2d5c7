"""`specdec.kernels.small_linear`: the few-row projection kernel against its reference
(`torch.nn.functional.linear`), on random shapes drawn by hypothesis and on the shipped models'
projection shapes; its launch tiles; its errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels.small_linear import (MAX_ROWS, choose_block_n, launch_config, small_linear_torch,
                                          small_linear_triton, small_linear_wins)
from _linear_tiles import few_programs
from tree_cases import DEVICE, FULL

pytestmark = pytest.mark.gpu  # scripts/gpu_check.sh runs it on CUDA, every shipped shape

# float32: products and sums in float32, another order than the reference's: a relative bound
# on the sum of |x| |w| (what a float32 dot of K terms can lose, K * 2^-24 each, with room).
# bf16 / fp16: both round the float32 result once, so they differ by at most one step of the
# output's dtype (plus the float32 slack above, far below it).
ULP = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _case(m, n, k, dtype, bias, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return [t if t is None else t.to(DEVICE) for t in (x, w, b)]


def _assert_close_to_reference(x, w, b):
    out = small_linear_triton(x, w, b)
    assert out.shape == (x.shape[0], w.shape[0]) and out.dtype == x.dtype
    exact = small_linear_torch(x.double(), w.double(), None if b is None else b.double())
    scale = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    bound = scale * (x.shape[1] + 2) * 2.0**-23 + exact.abs() * ULP[x.dtype] * 1.01
    err = (out.double() - exact).abs()
    assert bool((err <= bound).all()), f"largest error {err.max().item():.3g} over its bound"


@settings(max_examples=40 if FULL else 25, deadline=None)
@given(
    m=st.integers(1, MAX_ROWS),
    n=st.integers(1, 300),
    k=st.integers(1, 700),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_reference_on_random_shapes(m, n, k, dtype, bias, seed):
    with few_programs():
        _assert_close_to_reference(*_case(m, n, k, dtype, bias, seed))


# (N, K): SmolLM2-135M's qkv, o, gate/up and down; its EAGLE-3 head's qkv (2d in) and fc (3 captured
# states); a Llama-3-8B qkv (a grid of 96 programs of 64 columns). CI runs three of them on one SM's
# tiles, and one at the H100's (288 programs, ~10 s interpreted); a CUDA machine every one at 1 and 6 rows.
SHIPPED = [(960, 576), (576, 576), (3072, 576), (576, 1536), (960, 1152), (576, 1728), (6144, 4096)]
CASES = [(m, n, k) for m in (1, 6) for n, k in SHIPPED] if FULL else [(1, 960, 576), (6, 576, 576), (1, 576, 1728)]


@pytest.mark.parametrize("m, n, k", CASES)
def test_kernel_equals_reference_at_the_shipped_projection_shapes(m, n, k):
    with few_programs():
        _assert_close_to_reference(*_case(m, n, k, torch.bfloat16, False, n + k + m))


def test_one_row_on_the_h100s_tiles_and_k_in_two_slices():
    # SmolLM2's o_proj at 1 row as the H100 runs it (2 columns a program, all of K in one slice);
    # then a K past 1024, two slices
    _assert_close_to_reference(*_case(1, 576, 576, torch.bfloat16, False, 7))
    with few_programs():
        _assert_close_to_reference(*_case(2, 8, 1500, torch.float32, True, 8))


def test_a_row_past_a_strided_view_is_read_at_its_stride():
    # the attention output reaches o_proj as a reshaped view; a row-strided x must be read row by row
    x, w, _ = _case(3, 40, 64, torch.float32, False, 1)
    wide = torch.zeros(3, 100, device=DEVICE)
    wide[:, :64] = x
    out = small_linear_triton(wide[:, :64], w, None)
    assert torch.allclose(out, small_linear_torch(x, w, None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n, sms, block", [(576, 132, 4), (960, 132, 4), (3072, 132, 16), (16384, 132, 64),
                                           (49152, 132, 64), (4096, 132, 16), (10, 132, 4), (576, 8, 64)])
def test_block_n_gives_every_sm_a_program_while_it_can(n, sms, block):
    assert choose_block_n(n, sms) == block
    assert -(-n // block) >= sms or block == 4


@pytest.mark.parametrize("m, n, k, block_n, block_k", [(1, 960, 576, 2, 1024), (2, 576, 576, 2, 1024),
                                                      (1, 3072, 576, 4, 1024), (1, 576, 1536, 2, 1024),
                                                      (2, 7, 3, 2, 32)])
def test_one_or_two_rows_take_narrow_tiles_and_all_of_k(m, n, k, block_n, block_k):
    # the H100 sweep's best for 1-2 rows (sweep_configs_abfd635_h100.log): 2-4 columns, K in one slice, 2 warps
    assert launch_config(m, n, k, 132) == dict(M_PAD=2, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=2)


@pytest.mark.parametrize("m, n, k, wins", [(1, 960, 576, True), (2, 3072, 576, True), (1, 576, 1728, True),
                                           (3, 960, 576, False), (6, 576, 576, False), (1, 49152, 576, False),
                                           (1, 16384, 576, False), (1, 6144, 4096, False), (0, 8, 8, False)])
def test_the_kernels_are_chosen_where_they_measured_faster(m, n, k, wins):
    assert small_linear_wins(m, n, k) is wins


@pytest.mark.parametrize("m, n, k", [(1, 960, 576), (8, 3072, 576), (5, 576, 1536), (2, 7, 3)])
def test_launch_tiles_stay_within_the_register_budget(m, n, k):
    cfg = launch_config(m, n, k, 132)
    assert cfg["M_PAD"] >= max(2, m) and cfg["M_PAD"] & (cfg["M_PAD"] - 1) == 0
    assert cfg["M_PAD"] * cfg["BLOCK_N"] * cfg["BLOCK_K"] <= 4096 or cfg["BLOCK_K"] == 32


@pytest.mark.parametrize(
    "x_shape, w_shape, dtype, match",
    [((9, 8), (4, 8), torch.float32, "9 rows; allowed: 1 to MAX_ROWS=8"),
     ((0, 8), (4, 8), torch.float32, "0 rows"),
     ((2, 8), (4, 7), torch.float32, r"must be \[M, K\] and \[N, K\]"),
     ((2, 8), (4, 8), torch.float64, "must be one of"),
     ((2, 3, 8), (4, 8), torch.float32, r"must be \[M, K\]")],
)
def test_bad_inputs_are_refused_with_the_allowed_values(x_shape, w_shape, dtype, match):
    x = torch.zeros(x_shape, dtype=dtype, device=DEVICE)
    w = torch.zeros(w_shape, dtype=dtype, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        small_linear_triton(x, w, None)
