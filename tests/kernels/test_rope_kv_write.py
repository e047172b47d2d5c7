"""`specdec.kernels.rope_kv_write`: RoPE fused with the K/V store equals its reference (the
rotary piece, then `kv_write`), and `PagedKVCache.write_rotated` stores exactly the valid rows
of rotated keys whichever side runs. On the CPU the kernel runs in Triton's interpreter; on a
CUDA device the same tests compile it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels.rope_kv_write import rope_kv_write_torch, rope_kv_write_triton
from specdec.models.fused import rotary_qk
from specdec.runtime.kv_cache import PagedKVCache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu


def _inputs(gen, rows, heads, kv_heads, head_dim, slots, padding, dtype):
    H, Hkv, hd = heads, kv_heads, head_dim
    qkv = torch.randn(rows, (H + 2 * Hkv) * hd, generator=gen).to(dtype)  # the fused projection's rows
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)  # strided views
    angle = torch.rand(rows, hd // 2, generator=gen) * 6.3
    emb = torch.cat([angle, angle], dim=-1)  # [R, hd] as `rotary_cos_sin` lays it out
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    dst = torch.randperm(slots, generator=gen)[:rows]  # distinct cache rows
    dst = torch.where(torch.rand(rows, generator=gen) < padding, -1, dst)
    base = torch.randn(2 * (slots + 1) * Hkv * hd, generator=gen).to(dtype)  # flat storage: K region, V region
    to = lambda *xs: [x.to(DEVICE) for x in xs]  # noqa: E731
    return to(q, k, v, cos, sin, dst, base)


def _run(fn, q, k, v, cos, sin, dst, base, heads):
    """-> (rotated queries [R, H, hd], K rows, V rows [slots + 1, W] of the written storage)."""
    R, hd = cos.shape
    W = k.shape[1]
    region = base.numel() // 2
    q_out = torch.full((R, heads, hd), float("nan"), dtype=q.dtype, device=q.device)
    storage = base.clone()
    fn(q_out, storage, 0, region, region // W - 1, q, k, v, cos, sin, dst)
    return q_out, storage[:region].view(-1, W), storage[region:].view(-1, W)


@settings(max_examples=20, deadline=None)
@given(
    rows=st.integers(1, 9),
    heads=st.integers(1, 4),
    kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([2, 4, 8, 24, 64]),
    padding=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_reference_in_float32(rows, heads, kv_heads, head_dim, padding, seed):
    gen = torch.Generator().manual_seed(seed)
    args = _inputs(gen, rows, heads, kv_heads, head_dim, 12, padding, torch.float32)
    ref = _run(rope_kv_write_torch, *args, heads)
    got = _run(rope_kv_write_triton, *args, heads)
    live = slice(0, 12)  # the sink row (last) is never read
    # the interpreter computes op by op as the reference does: exact; a GPU may contract to FMA
    close = dict(rtol=0, atol=0) if DEVICE == "cpu" else dict(rtol=2e-7, atol=2e-7)
    torch.testing.assert_close(got[0], ref[0], **close)
    torch.testing.assert_close(got[1][live], ref[1][live], **close)
    assert torch.equal(got[2][live], ref[2][live])  # V is copied, never rounded
    base, dst = args[-1], args[-2]
    base_k = base[: base.numel() // 2].view(13, -1)
    untouched = torch.ones(12, dtype=torch.bool, device=DEVICE)
    untouched[dst[dst >= 0]] = False
    assert torch.equal(got[1][:12][untouched], base_k[:12][untouched])  # padding rows wrote nothing


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 9), head_dim=st.sampled_from([8, 64, 128]), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_half_precision_rounds_once(rows, head_dim, seed, dtype):
    """In bf16/fp16 the kernel equals the reference computed in float32 and rounded once (what
    the compiled rotary piece does), and stays within an ulp of the op-by-op reference."""
    gen = torch.Generator().manual_seed(seed)
    args = _inputs(gen, rows, 3, 1, head_dim, 12, 0.3, dtype)
    got = _run(rope_kv_write_triton, *args, 3)
    wide = [x.float() if x.is_floating_point() else x for x in args]
    once = _run(rope_kv_write_torch, *wide, 3)
    torch.testing.assert_close(got[0], once[0].to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(got[1][:12], once[1][:12].to(dtype), rtol=0, atol=0)
    op_by_op = _run(rope_kv_write_torch, *args, 3)
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(got[0].float(), op_by_op[0].float(), rtol=2 * ulp, atol=4 * ulp)


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_cache_write_rotated_stores_rotated_keys_at_valid_rows_only(impl):
    cache = PagedKVCache(2, [1, 2], 4, max_batch_size=2, max_seq_len=12, block_size=4, num_blocks=6, device=DEVICE)
    cache.reserve(0, 8)
    cache.reserve(1, 4)
    cache.storage.normal_()
    before = [cache.k_rows(i)[:-1].clone() for i in range(2)] + [cache.v_rows(i)[:-1].clone() for i in range(2)]
    positions = torch.tensor([[5, 6, 7], [1, 2, 3]], device=DEVICE)
    valid = torch.tensor([[True, True, False], [True, False, False]], device=DEVICE)
    index = cache.write_index(torch.tensor([0, 1], device=DEVICE), positions, valid)
    q, k, v = (torch.randn(2, 3, h, 4, device=DEVICE) for h in (3, 2, 2))
    emb = torch.rand(2, 3, 1, 2, device=DEVICE).repeat(1, 1, 1, 2) * 6.3
    cos, sin = emb.cos(), emb.sin()
    q_rot = cache.write_rotated(1, q, k, v, cos, sin, index, rotary=rotary_qk, impl=impl)
    want_q, want_k = rotary_qk(q, k, cos, sin)
    torch.testing.assert_close(q_rot, want_q, rtol=2e-7, atol=2e-7)
    got_k, got_v = cache.gather(1, torch.tensor([0, 1], device=DEVICE), positions)
    torch.testing.assert_close(got_k[0, :2], want_k[0, :2], rtol=2e-7, atol=2e-7)
    torch.testing.assert_close(got_k[1, :1], want_k[1, :1], rtol=2e-7, atol=2e-7)
    assert torch.equal(got_v[0, :2], v[0, :2]) and torch.equal(got_v[1, :1], v[1, :1])
    after = [cache.k_rows(i)[:-1] for i in range(2)] + [cache.v_rows(i)[:-1] for i in range(2)]
    changed = [int((a != b).sum()) for a, b in zip(after, before)]  # sink rows excluded
    assert changed == [0, 3 * 2 * 4, 0, 3 * 2 * 4]  # three rows of 2 heads x 4 dims, K and V of layer 1
