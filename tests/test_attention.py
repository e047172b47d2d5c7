"""Paged attention: the compiled path (Triton) == the dense reference, and the reference == plain attention.

The reference (`impl="ref"`) is itself checked against independent statements of the rule:
torch SDPA on the contiguous sequence (prefill, chunked prefill, decode, sliding window) and a
per-node walk up the parent links (trees). The cache is filled with random values first, so
a key that leaks through the mask changes the output.
"""

import math

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from specdec.kernels.tree_attention import paged_attention
from specdec.runtime.attention import AttentionBatch, attention, query_positions
from specdec.runtime.batch import decode_batch, prefill_batch, tree_batch
from specdec.runtime.kv_cache import PagedKVCache
from specdec.types import TreeMeta

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ATOL = 2e-5


def pack_tree(parents: list[list[int]], num_slots: int) -> TreeMeta:
    """Ancestor-or-self bits and depths from parent links (padding rows: self bit only)."""
    B, words = len(parents), (num_slots + 31) // 32
    meta = TreeMeta.empty(B, num_slots)
    mask = torch.zeros(B, num_slots, words, dtype=torch.int64)
    for b, par in enumerate(parents):
        for i in range(num_slots):
            node, depth = i, 0
            mask[b, i, i // 32] |= 1 << (i % 32)
            while i < len(par) and par[node] >= 0:
                node = par[node]
                depth += 1
                mask[b, i, node // 32] |= 1 << (node % 32)
            meta.positions[b, i] = depth
    meta.packed_mask.copy_(torch.where(mask >= 2**31, mask - 2**32, mask).to(torch.int32))
    return meta


def random_cache(heads, head_dim, block_size, batch, seq_len, gen, dtype=torch.float32):
    cache = PagedKVCache(len(heads), heads, head_dim, max_batch_size=batch, max_seq_len=seq_len,
                         block_size=block_size, device=DEVICE, dtype=dtype)
    for end in range(block_size, seq_len + block_size, block_size):  # interleaved block tables
        for slot in range(batch):
            cache.reserve(slot, min(end, seq_len))
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).to(dtype))
    return cache


def sdpa_rows(q, k, v, visible, scale):
    """Plain attention of q [T, H, hd] over k, v [S, Hkv, hd] with a [T, S] bool mask."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    scores = torch.einsum("thd,shd->hts", q.double(), k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v).float()


@st.composite
def tree_cases(draw, head_dims=(4, 8, 12, 16)):
    batch = draw(st.integers(1, 3))
    num_slots = draw(st.integers(1, 40))
    parents, num_nodes, committed = [], [], []
    for _ in range(batch):
        n = draw(st.integers(0, num_slots))  # 0 = inactive slot
        par = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
        parents.append(par)
        num_nodes.append(n)
        committed.append(draw(st.integers(0, 50)))
    return dict(
        batch=batch, num_slots=num_slots, parents=parents, num_nodes=num_nodes, committed=committed,
        block_size=draw(st.sampled_from([1, 2, 3, 4, 16])), kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 3, 4])), head_dim=draw(st.sampled_from(head_dims)),
        window=draw(st.one_of(st.none(), st.integers(1, 24))), splits=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 2**16)),
    )


def build_tree_step(case):
    gen = torch.Generator().manual_seed(case["seed"])
    B, N, hkv, hd = case["batch"], case["num_slots"], case["kv_heads"], case["head_dim"]
    H = hkv * case["group"]
    cache = random_cache([hkv, 1], hd, case["block_size"], B, 50 + N + 3, gen)
    meta = pack_tree(case["parents"], N)
    cache_len = torch.tensor(case["committed"], device=DEVICE)
    meta = TreeMeta(*(x.to(DEVICE) for x in (meta.packed_mask, meta.positions, meta.next_token,
                                              meta.next_sibling, meta.retrieve_index)))
    batch = tree_batch(cache, cache_len, meta, torch.tensor(case["num_nodes"], device=DEVICE))
    k, v = torch.randn(2, B, N, hkv, hd, generator=gen).to(DEVICE)
    cache.write(0, k, v, batch.write_index)
    q = torch.randn(B, N, H, hd, generator=gen).to(DEVICE)
    return cache, batch, q


@given(tree_cases())
def test_tree_attention_kernel_equals_dense_reference_on_random_trees(case):
    note(case)
    cache, batch, q = build_tree_step(case)
    scale = case["head_dim"] ** -0.5
    ref = attention(q, cache, 0, batch, scale=scale, sliding_window=case["window"], impl="ref")
    out = paged_attention(q, cache, 0, batch, scale=scale, sliding_window=case["window"],
                          num_splits=case["splits"], autotune=False)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)


@settings(max_examples=min(10, settings().max_examples))  # eager on CPU, one compile per shape on GPU
@given(tree_cases(head_dims=(16,)))  # compiled FlexAttention wants head_dim >= 16
def test_flex_attention_path_equals_dense_reference_on_random_trees(case):
    note(case)
    cache, batch, q = build_tree_step(case)
    scale = case["head_dim"] ** -0.5
    ref = attention(q, cache, 0, batch, scale=scale, sliding_window=case["window"], impl="ref")
    out = attention(q, cache, 0, batch, scale=scale, sliding_window=case["window"], impl="flex")
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)


@given(tree_cases())
def test_tree_reference_equals_attention_over_each_nodes_ancestors(case):
    note(case)
    cache, batch, q = build_tree_step(case)
    scale = case["head_dim"] ** -0.5
    ref = attention(q, cache, 0, batch, scale=scale, sliding_window=case["window"], impl="ref")
    positions = torch.arange(cache.max_seq_len, device=DEVICE)[None]
    for b in range(case["batch"]):
        c, par = case["committed"][b], case["parents"][b]
        keys, vals = (x[0] for x in cache.gather(0, batch.slots[b : b + 1], positions))
        for i in range(case["num_nodes"][b]):
            path, depth = [i], 0
            while par[path[-1]] >= 0:
                path.append(par[path[-1]])
            depth = len(path) - 1
            visible = torch.zeros(1, cache.max_seq_len, dtype=torch.bool, device=DEVICE)
            visible[0, :c] = True
            for node in path:
                visible[0, c + node] = True
            if case["window"] is not None:  # key positions: committed j -> j, node -> c + its depth
                kpos = torch.arange(cache.max_seq_len, device=DEVICE)
                for node in path:
                    kpos[c + node] = c + depth - path.index(node)
                visible &= (c + depth - kpos < case["window"])[None]
            expected = sdpa_rows(q[b, i : i + 1], keys, vals, visible, scale)
            torch.testing.assert_close(ref[b, i : i + 1], expected, atol=ATOL, rtol=1e-4)
        assert (ref[b, case["num_nodes"][b] :] == 0).all()  # padding rows


@st.composite
def causal_cases(draw):
    batch = draw(st.integers(1, 3))
    T = draw(st.integers(1, 24))
    return dict(
        batch=batch, T=T, q_len=[draw(st.integers(0, T)) for _ in range(batch)],
        committed=[draw(st.integers(0, 40)) for _ in range(batch)],
        block_size=draw(st.sampled_from([1, 3, 4, 8])), kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4])), head_dim=draw(st.sampled_from([8, 16])),
        window=draw(st.one_of(st.none(), st.integers(1, 30))), splits=draw(st.integers(1, 2)),
        seed=draw(st.integers(0, 2**16)), reversed_slots=draw(st.booleans()),
    )


@given(causal_cases())
def test_prefill_and_chunked_prefill_match_sdpa_on_the_contiguous_sequence(case):
    note(case)
    gen = torch.Generator().manual_seed(case["seed"])
    B, T, hkv, hd = case["batch"], case["T"], case["kv_heads"], case["head_dim"]
    H = hkv * case["group"]
    cache = random_cache([1, hkv], hd, case["block_size"], B, 40 + T + 1, gen)
    slots = torch.arange(B, device=DEVICE)
    if case["reversed_slots"]:
        slots = slots.flip(0)
    batch = prefill_batch(cache, slots, torch.tensor(case["committed"], device=DEVICE),
                          torch.tensor(case["q_len"], device=DEVICE), T, max_kv_len=40 + T)
    k, v = torch.randn(2, B, T, hkv, hd, generator=gen).to(DEVICE)
    cache.write(1, k, v, batch.write_index)
    q = torch.randn(B, T, H, hd, generator=gen).to(DEVICE)
    scale, window = 1 / math.sqrt(hd), case["window"]
    ref = attention(q, cache, 1, batch, scale=scale, sliding_window=window, impl="ref")
    out = paged_attention(q, cache, 1, batch, scale=scale, sliding_window=window, num_splits=case["splits"],
                          autotune=False)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)
    for b in range(B):
        c, n = case["committed"][b], case["q_len"][b]
        keys, vals = (x[0] for x in cache.gather(1, slots[b : b + 1], torch.arange(c + n, device=DEVICE)[None]))
        qpos = torch.arange(c, c + n, device=DEVICE)[:, None]
        kpos = torch.arange(c + n, device=DEVICE)[None, :]
        visible = (kpos <= qpos) & ((qpos - kpos < window) if window else True)
        if n:
            torch.testing.assert_close(ref[b, :n], sdpa_rows(q[b, :n], keys, vals, visible, scale), atol=ATOL, rtol=1e-4)
        assert (ref[b, n:] == 0).all() and (out[b, n:] == 0).all()


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_step_matches_sdpa_over_the_whole_history_and_skips_inactive_slots(splits):
    gen = torch.Generator().manual_seed(0)
    cache = random_cache([2], 16, 4, 3, 600, gen)
    cache_len = torch.tensor([517, 0, 33], device=DEVICE)
    batch = decode_batch(cache, cache_len, torch.tensor([True, False, True], device=DEVICE), max_kv_len=600)
    k, v = torch.randn(2, 3, 1, 2, 16, generator=gen).to(DEVICE)
    cache.write(0, k, v, batch.write_index)
    q = torch.randn(3, 1, 8, 16, generator=gen).to(DEVICE)
    ref = attention(q, cache, 0, batch, scale=0.25, impl="ref")
    out = paged_attention(q, cache, 0, batch, scale=0.25, num_splits=splits)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)
    assert (ref[1] == 0).all() and (out[1] == 0).all()
    for b in (0, 2):
        n = int(cache_len[b]) + 1
        keys, vals = (x[0] for x in cache.gather(0, batch.slots[b : b + 1], torch.arange(n, device=DEVICE)[None]))
        expected = sdpa_rows(q[b], keys, vals, torch.ones(1, n, dtype=torch.bool, device=DEVICE), 0.25)
        torch.testing.assert_close(ref[b], expected, atol=ATOL, rtol=1e-4)


def test_bfloat16_kernel_is_close_to_the_float32_reference():
    gen = torch.Generator().manual_seed(1)
    cache = random_cache([2], 64, 16, 2, 200, gen, dtype=torch.bfloat16)
    meta = pack_tree([[-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 2]], 7)
    meta = TreeMeta(*(x.to(DEVICE) for x in (meta.packed_mask, meta.positions, meta.next_token,
                                              meta.next_sibling, meta.retrieve_index)))
    batch = tree_batch(cache, torch.tensor([150, 31], device=DEVICE), meta, torch.tensor([7, 4], device=DEVICE))
    cache.write(0, *torch.randn(2, 2, 7, 2, 64, generator=gen).to(DEVICE), batch.write_index)
    q = torch.randn(2, 7, 8, 64, generator=gen).to(DEVICE, torch.bfloat16)
    ref = attention(q.float(), cache, 0, batch, scale=0.125, impl="ref")
    out = paged_attention(q, cache, 0, batch, scale=0.125, num_splits=2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_derived_positions_of_a_tree_are_committed_length_plus_depth():
    meta = pack_tree([[-1, 0, 1, 0, 3, 4, 5] + [0] * 30 + [6]], 38)  # node 37's bits span two words
    batch = AttentionBatch(slots=torch.tensor([0]), cache_len=torch.tensor([10]), q_len=torch.tensor([38]),
                           write_index=torch.zeros(1, 38, dtype=torch.int64), tree_mask=meta.packed_mask,
                           max_kv_len=64)
    assert torch.equal(query_positions(batch), 10 + meta.positions)
    assert query_positions(batch)[0, 37] == 10 + 5  # 37 -> 6 -> 5 -> 4 -> 3 -> 0


def test_bad_inputs_name_the_value_and_the_allowed_range():
    cache = PagedKVCache(1, 2, 8, max_batch_size=1, max_seq_len=16, block_size=4)
    batch = prefill_batch(cache, torch.tensor([0]), torch.tensor([0]), torch.tensor([2]), 2)
    with pytest.raises(ValueError, match=r"H=3 must be a multiple of layer 0's KV heads \(2\)"):
        attention(torch.zeros(1, 2, 3, 8), cache, 0, batch, scale=1.0)
    with pytest.raises(ValueError, match=r"impl='fast' is unknown"):
        attention(torch.zeros(1, 2, 2, 8), cache, 0, batch, scale=1.0, impl="fast")
    with pytest.raises(ValueError, match=r"layer=1 is out of range; allowed: \[0, 1\)"):
        attention(torch.zeros(1, 2, 2, 8), cache, 1, batch, scale=1.0)


def test_reference_attention_compiles_without_graph_breaks():
    gen = torch.Generator().manual_seed(2)
    cache = random_cache([2], 8, 4, 2, 32, gen)
    meta = pack_tree([[-1, 0, 0], [-1, 0, 1]], 3)
    meta = type(meta)(**{k: v.to(DEVICE) for k, v in vars(meta).items()})
    batch = tree_batch(cache, torch.tensor([5, 9], device=DEVICE), meta, torch.tensor([3, 2], device=DEVICE))
    q = torch.randn(2, 3, 4, 8, generator=gen).to(DEVICE)
    step = torch.compile(lambda q, b: attention(q, cache, 0, b, scale=0.3, sliding_window=4, impl="ref"), fullgraph=True)
    torch.testing.assert_close(step(q, batch), attention(q, cache, 0, batch, scale=0.3, sliding_window=4, impl="ref"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile traces Triton kernels only when compiled for a GPU")
def test_kernel_compiles_without_graph_breaks_and_no_recompile_for_a_second_tree():
    gen = torch.Generator().manual_seed(3)
    cache = random_cache([2], 64, 16, 4, 256, gen, dtype=torch.bfloat16)
    step = torch.compile(lambda q, b: attention(q, cache, 0, b, scale=0.125, impl="triton"), fullgraph=True)
    for i, parents in enumerate(([[-1, 0, 0, 1]] * 4, [[-1, 0, 1, 1]] * 4)):
        meta = TreeMeta(*(x.cuda() for x in vars(pack_tree(parents, 4)).values()))
        batch = tree_batch(cache, torch.tensor([100, 3, 50, 7], device="cuda") + i, meta, torch.full((4,), 4, device="cuda"))
        q = torch.randn(4, 4, 8, 64, generator=gen).to("cuda", torch.bfloat16)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = step(q, batch)
        torch.testing.assert_close(out.float(), attention(q.float(), cache, 0, batch, scale=0.125, impl="ref"),
                                   atol=2e-2, rtol=2e-2)


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return os.path.exists(get_ptxas(90).path)
    except Exception:  # noqa: BLE001 - no nvidia backend in this triton build
        return False


def run_aot_compile(kernel_family: str) -> None:
    """Lower the real GPU path of the kernels to sm_90 cubin in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_aot_compile_kernels.py")
    proc = subprocess.run([sys.executable, str(script), kernel_family], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.skipif(not _ptxas_available(), reason="this triton build has no NVIDIA backend (ptxas) to compile with")
def test_attention_kernel_compiles_for_sm90_even_without_a_gpu():
    run_aot_compile("attention")
