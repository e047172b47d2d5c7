"""Properties of tree builders (`specdec_build_tree`) and KV relocators (`specdec_relocate_kv`).

Tree builder ``(parents [B, N], num_nodes [B], out=None) -> TreeMeta``: every field against a
plain parent walk (ancestor bits, depths, first-child / next-sibling lists, retrieve index,
padding rows), and buffer reuse without stale state. Relocator ``(cache, committed_len,
accept_nodes, accept_length)``: the whole KV storage against a per-token Python loop (so
nothing outside the moved positions may change), for overlapping paths and permutations.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from ..kernels.kv_relocate import relocate_kv_naive
from ..runtime.kv_cache import PagedKVCache
from ..types import TreeMeta
from .kit import register
from .oracles import children_lists, unpack_mask
from .strategies import forests, make_forest

FIELDS = ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index")


def check_tree_meta(forest, meta: TreeMeta) -> None:
    """Every field of `meta` against the parent walk of `forest` (AssertionError names the field)."""
    B, N = forest.batch, forest.slots
    assert tuple(meta.packed_mask.shape) == (B, N, (N + 31) // 32) and meta.packed_mask.dtype == torch.int32, "packed_mask shape"
    bits = unpack_mask(meta.packed_mask.cpu()).numpy()  # [B, N, 32W]
    parents, num_nodes = forest.parents.tolist(), forest.num_nodes.tolist()
    positions, nt, ns, ridx = (t.cpu().tolist() for t in (meta.positions, meta.next_token, meta.next_sibling, meta.retrieve_index))
    for b in range(B):
        n = num_nodes[b]
        expect = np.zeros((N, bits.shape[-1]), dtype=bool)  # ancestor-or-self rows; bits >= N clear
        for i in range(N):
            if 0 < i < n:
                expect[i] = expect[parents[b][i]]
            expect[i, i] = True  # padding rows: self bit only
        assert (bits[b] == expect).all(), f"packed_mask row {b}: wrong bits at {np.argwhere(bits[b] != expect)[:5].tolist()}"
        assert positions[b] == [int(expect[i].sum()) - 1 for i in range(N)], f"positions row {b}"
        assert ridx[b] == [b * N + i if i < n else -1 for i in range(N)], f"retrieve_index row {b}"
        kids = children_lists(parents[b], n)
        for i in range(N):
            walked, c = [], nt[b][i]
            while c != -1 and len(walked) <= N:
                walked.append(c)
                c = ns[b][c]
            assert walked == (kids[i] if i < n else []), f"children of node {i} in row {b}: walked {walked}"
        assert ns[b][0] == -1 and all(ns[b][i] == -1 for i in range(n, N)), f"next_sibling row {b}"


def _sizes(ctx) -> dict:
    return dict(max_batch=8, max_slots=256) if ctx.full else dict(max_batch=3, max_slots=70)


@register("tree-builder", "tree metadata matches a plain parent walk", ci=25, gpu=500)
def tree_metadata_matches_the_parent_walk(subject, ctx):
    build = subject.obj

    @ctx.settings_for(tree_metadata_matches_the_parent_walk)
    @given(data=st.data())
    def check(data):
        forest = data.draw(forests(**_sizes(ctx)))
        note(repr(forest))
        meta = build(forest.parents.to(ctx.device), forest.num_nodes.to(ctx.device))
        check_tree_meta(forest, meta)

    check()


@register("tree-builder", "a reused buffer keeps no stale bit of a deeper tree", ci=6, gpu=100)
def reused_buffers_keep_no_stale_state(subject, ctx):
    build = subject.obj
    B, N = (8, 256) if ctx.full else (3, 70)

    @ctx.settings_for(reused_buffers_keep_no_stale_state)
    @given(seed=st.integers(0, 2**31 - 1), shallow=st.sampled_from(["star", "random", "layered"]))
    def check(seed, shallow):
        buf = TreeMeta.empty(B, N, device=ctx.device)
        for t in (buf.packed_mask, buf.positions, buf.next_token, buf.next_sibling, buf.retrieve_index):
            t.fill_(-1)  # every bit set, every link pointing somewhere
        deep = make_forest(B, N, "chain", seed, padded=False)
        build(deep.parents.to(ctx.device), deep.num_nodes.to(ctx.device), out=buf)
        forest = make_forest(B, N, shallow, seed + 1, padded=True)
        note(repr(forest))
        out = build(forest.parents.to(ctx.device), forest.num_nodes.to(ctx.device), out=buf)
        assert out is buf, "build_tree(out=buf) must fill and return buf"
        check_tree_meta(forest, buf)

    check()


# ----------------------------------------------------------------------------- relocation
def _cache(heads, head_dim, block_size, batch, seq_len, seed, device):
    cache = PagedKVCache(len(heads), heads, head_dim, max_batch_size=batch, max_seq_len=seq_len,
                         block_size=block_size, device=device, dtype=torch.float32)
    for end in range(block_size, seq_len + block_size, block_size):  # interleaved block tables
        for slot in reversed(range(batch)):
            cache.reserve(slot, min(end, seq_len))
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=torch.Generator().manual_seed(seed)))
    return cache


@st.composite
def relocation_cases(draw, max_path: int):
    heads = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    batch, n = draw(st.integers(1, 3)), draw(st.integers(1, 12))
    width = min(n, max_path)
    committed, nodes, lengths = [], [], []
    for _ in range(batch):
        committed.append(draw(st.integers(0, 20)))
        if draw(st.booleans()):  # a tree path: increasing, node j >= j (the real case)
            length = draw(st.integers(0, width - 1))
            picked = sorted(draw(st.sets(st.integers(1, n - 1), min_size=length, max_size=length))) if n > 1 else []
            path = [0] + picked
        else:  # any permutation of distinct nodes: gather-then-scatter must still hold
            path = draw(st.permutations(range(n)))[:width]
            length = draw(st.integers(0, width - 1))
        lengths.append(length)
        nodes.append((list(path) + [-1] * n)[:n])
    return dict(heads=heads, head_dim=draw(st.integers(1, 9)), block_size=draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
                batch=batch, seq_len=20 + n + draw(st.integers(0, 5)), committed=committed, nodes=nodes,
                lengths=lengths, seed=draw(st.integers(0, 2**16)))


@register("relocator", "accepted KV moves to committed + j and nothing else changes", ci=25, gpu=500)
def relocation_matches_a_per_token_loop(subject, ctx):
    relocate, max_path = subject.obj, subject.caps

    @ctx.settings_for(relocation_matches_a_per_token_loop)
    @given(case=relocation_cases(max_path))
    def check(case):
        note(case)
        cache = _cache(case["heads"], case["head_dim"], case["block_size"], case["batch"], case["seq_len"], case["seed"], ctx.device)
        expected = _cache(case["heads"], case["head_dim"], case["block_size"], case["batch"], case["seq_len"], case["seed"], ctx.device)
        args = [torch.tensor(case[k], dtype=torch.int64, device=ctx.device) for k in ("committed", "nodes", "lengths")]
        relocate(cache, *args)
        relocate_kv_naive(expected, *args)
        assert torch.equal(cache.storage, expected.storage), "KV storage differs from the per-token loop"

    check()
