"""Paged attention as one Triton kernel: prefill (causal), decode and tree verification.

Owns the kernel that reads K/V straight from `PagedKVCache` through the block tables
(no gathered copy), its split-KV combine kernel, and `paged_attention` (the entry point
behind `runtime.attention(..., impl="triton")`). The specification is
`specdec.runtime.attention.attention_ref`, with the same arguments; the visibility rule
(including `key_len`) is written down there and is not repeated here. Imports only
`runtime.attention_batch` from specdec.

Work split: one program per (row b, KV head, tile of BLOCK_M query rows, key split). The
query rows of a tile are (t, g) pairs, t = query row, g = head in the GQA group of that KV
head, so the G query heads sharing a KV head read each K/V tile once. Long contexts with
few programs (bs 1) are split along the keys (flash-decoding); each split writes a partial
output and its log-sum-exp, and a second kernel combines them.

Launches do not depend on the context length (one CUDA graph serves every length): the
number of splits NUM_SPLITS comes from static sizes only (`choose_num_splits`; max_kv_len
is an upper bound there), and each program finds its key range from the row's real key
count: the tile's keys [lo, end) (end = cache_len + new keys, fewer for a causal tile, lo >
0 only under a sliding window) are cut into NUM_SPLITS pieces of L = ceil((end - lo) /
NUM_SPLITS) keys (at least min_split_keys: `choose_min_split_keys`) rounded up to the key tiles
(BLOCK_N for the new keys, BLOCK_N_C for committed ones); split s scans [lo + s*L, lo + (s+1)*L) ∩ [lo, end).
Splits past the real length scan nothing and write an empty partial (lse = -inf), which
the combine kernel gives weight 0. A row with no query rows (q_len 0: an idle slot) scans
nothing: a finished request's slot keeps its committed length while its blocks are freed.
"""

from __future__ import annotations

import os

import torch

from specdec.runtime.attention_batch import check_batch, query_positions

try:
    import triton
    import triton.language as tl
    from torch.library import triton_op
    from .launch import wrap_triton

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False

__all__ = ["paged_attention", "paged_attention_triton"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _fixed_config(block_n: int, committed_block_n: int, maskless: bool) -> dict:
    """Launch parameters without autotuning (tests: one compile per shape family); the tiles
    from `choose_block_n` and `choose_committed_tile`. BLOCK_N_C: keys per tile of the
    committed-keys-only loop (no tree-mask arithmetic there), which may be larger than the new
    keys' BLOCK_N; MASKLESS_C: that loop reads whole tiles without bounds or visibility masks
    (used only without a sliding window). The interpreter runs 16-key tiles for the new keys
    whatever the choice (fewer numpy steps per tile; it checks semantics, not speed), and the
    committed tiles as chosen, so that it checks the path the GPU runs."""
    if _INTERPRET:
        return dict(BLOCK_N=16, BLOCK_N_C=committed_block_n, MASKLESS_C=maskless, COMMITTED_FIRST=True)
    return dict(BLOCK_N=block_n, BLOCK_N_C=committed_block_n, MASKLESS_C=maskless, num_warps=4, num_stages=2,
                COMMITTED_FIRST=True)


def _combine_rows() -> int:
    """Output rows per split-KV combine program. GPU: 1, the most programs (a bs-1 decode
    combines only B*T*H = 32 rows; 16 rows per program ran 2 programs that each walked 32
    splits one load after another, ~10 us per layer on the H200). Interpreter: 16, fewer
    programs for numpy to run. Each program runs one warp: its tile is only SPLITS_PAD x HD_PAD
    (8 x 128 at the 8B tree), and 4 warps mostly idled (H100, bf16, batch 1, 32 layers: the 8B tree
    at 1k 0.678 -> 0.531 ms a forward, decode 0.277 -> 0.260; notes/gpu/issue20/partial_sweep.py)."""
    return 16 if _INTERPRET else 1


def _autotune_configs():
    if _INTERPRET:  # the interpreter only checks semantics: one config
        return [triton.Config({"BLOCK_N": 16, "BLOCK_N_C": 16, "MASKLESS_C": False, "COMMITTED_FIRST": True},
                              num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_N_C": bn, "MASKLESS_C": False, "COMMITTED_FIRST": True},
                      num_warps=w, num_stages=s)
        for bn, w, s in ((16, 4, 2), (32, 4, 2), (64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2))
    ]


if HAS_TRITON:

    @triton.jit
    def _load_tile(
        start, hi, slot, hkv, d, d_ok, k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt, MAX_POS,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, OFFS32: tl.constexpr, INTERPRET: tl.constexpr,
        MASKLESS: tl.constexpr,
    ):
        """K and V of the key tile [start, start + BLOCK_N) ∩ [.., hi), read through the block
        table; keys out of range (or unallocated) load as 0 and come back with key_ok False.
        MASKLESS: the caller guarantees a whole tile of committed (allocated) keys below hi, so
        nothing but the head-dim padding is masked and key_ok is all True. INTERPRET: K/V come back
        in float32 (the interpreter's 16-bit dot is wrong), and the maskless promise is asserted
        (`tl.device_assert`, live where the build has debug on: the tests switch it on; on the GPU
        it is not compiled in at all, since torch.compile builds its kernels with debug on and the
        check would sit in the hot loop)."""
        pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical key positions
        if MASKLESS:
            blk = tl.load(bt_ptr + slot * sbt + pos // BLOCK_SIZE)
            if INTERPRET:  # an unallocated block (-1) gives negative rows: reads before the cache
                tl.device_assert(blk >= 0, "maskless tile over an unallocated KV block")
            key_ok = pos >= 0  # all True: start >= 0
        else:
            in_range = (pos < hi) & (pos < MAX_POS)  # past the block table: unallocated, never read
            blk = tl.load(bt_ptr + slot * sbt + pos // BLOCK_SIZE, mask=in_range, other=-1)
            key_ok = in_range & (blk >= 0)
        row = blk * BLOCK_SIZE + pos % BLOCK_SIZE  # flat token row
        if OFFS32:  # the layer's rows fit in 2^31 elements (checked on the host): 32-bit offsets
            row = row.to(tl.int32)
        kv_off = row[:, None] * skv_tok + hkv * skv_h + d[None, :]  # [BLOCK_N, HD_PAD]
        if MASKLESS:
            kv_mask = (pos >= 0)[:, None] & d_ok[None, :]  # the head-dim padding only
        else:
            kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)  # [BLOCK_N, HD_PAD]
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        if INTERPRET:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        return k, v, key_ok

    @triton.jit
    def _attend_tile(
        start, k, v, key_ok, q, m_i, l_i, acc, t, row_ok, cache_len, b, qpos,
        mask_ptr, sm_b, sm_t, pos_ptr, sp_b, scale, window,
        BLOCK_N: tl.constexpr, IS_TREE: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr,
        NEW_KEYS: tl.constexpr, MASKLESS: tl.constexpr,
    ):
        """One loaded key tile: scores, visibility, online-softmax update. NEW_KEYS False: the
        tile holds committed keys only, visible to every row (but for a window): no tree-mask
        or causal arithmetic, and no row mask (padding rows are zeroed at the end). MASKLESS
        (committed keys, no window): a whole tile, every key visible, no mask at all."""
        pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical key positions
        # cast: under torch.compile the scale can arrive as an fp64 constant, which would
        # promote the running max and sum to fp64 (a loop-carried type error on the GPU)
        s = (tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale).to(tl.float32)  # [BLOCK_M, BLOCK_N]
        if not MASKLESS:
            if NEW_KEYS:
                visible = _visible_new(pos, key_ok, t, row_ok, cache_len, b, qpos, mask_ptr, sm_b, sm_t, pos_ptr,
                                       sp_b, window, IS_TREE, HAS_WINDOW)
            else:
                visible = key_ok[None, :]  # [1, BLOCK_N]
                if HAS_WINDOW:
                    visible = visible & ((qpos[:, None] - pos[None, :]) < window)
            s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _visible_new(
        pos, key_ok, t, row_ok, cache_len, b, qpos, mask_ptr, sm_b, sm_t, pos_ptr, sp_b, window,
        IS_TREE: tl.constexpr, HAS_WINDOW: tl.constexpr,
    ):
        """[BLOCK_M, BLOCK_N] visibility of a tile that may hold new keys: committed keys to every
        row, new keys by the tree mask (or causally), a window on top."""
        kk = pos - cache_len  # index of the new row at this key, < 0 for committed keys
        is_new = kk >= 0
        kk_safe = tl.where(is_new, kk, 0)
        if IS_TREE:
            word = tl.load(
                mask_ptr + b * sm_b + t[:, None] * sm_t + (kk_safe // 32)[None, :],
                mask=row_ok[:, None] & (is_new & key_ok)[None, :],
                other=0,
            )
            related = ((word >> (kk_safe % 32).to(tl.int32)[None, :]) & 1) != 0
        else:
            related = kk_safe[None, :] <= t[:, None]
        visible = row_ok[:, None] & key_ok[None, :] & ((~is_new)[None, :] | related)
        if HAS_WINDOW:
            new_pos = tl.load(pos_ptr + b * sp_b + kk_safe, mask=is_new & key_ok, other=0)
            kpos = tl.where(is_new, new_pos, pos)
            visible = visible & ((qpos[:, None] - kpos[None, :]) < window)
        return visible

    @triton.jit
    def _scan(
        lo, hi, q, m_i, l_i, acc, t, row_ok, d, d_ok, slot, cache_len, b, hkv, qpos,
        k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt, mask_ptr, sm_b, sm_t, pos_ptr, sp_b, scale, window, MAX_POS,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, IS_TREE: tl.constexpr, HAS_WINDOW: tl.constexpr,
        PRECISION: tl.constexpr, OFFS32: tl.constexpr, NEW_KEYS: tl.constexpr, INTERPRET: tl.constexpr,
        MASKLESS: tl.constexpr,
    ):
        """The key tiles [lo, hi) in steps of BLOCK_N, folded into the running softmax."""
        if INTERPRET:  # the interpreter cannot take tensor bounds in range() (numpy 2); same body
            start = lo
            while start < hi:
                k, v, key_ok = _load_tile(start, hi, slot, hkv, d, d_ok, k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt,
                                          MAX_POS, BLOCK_SIZE, BLOCK_N, OFFS32, INTERPRET, MASKLESS)
                m_i, l_i, acc = _attend_tile(
                    start, k, v, key_ok, q, m_i, l_i, acc, t, row_ok, cache_len, b, qpos, mask_ptr, sm_b, sm_t,
                    pos_ptr, sp_b, scale, window, BLOCK_N, IS_TREE, HAS_WINDOW, PRECISION, NEW_KEYS, MASKLESS,
                )
                start += BLOCK_N
        else:
            for start in range(lo, hi, BLOCK_N):
                k, v, key_ok = _load_tile(start, hi, slot, hkv, d, d_ok, k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt,
                                          MAX_POS, BLOCK_SIZE, BLOCK_N, OFFS32, False, MASKLESS)
                m_i, l_i, acc = _attend_tile(
                    start, k, v, key_ok, q, m_i, l_i, acc, t, row_ok, cache_len, b, qpos, mask_ptr, sm_b, sm_t,
                    pos_ptr, sp_b, scale, window, BLOCK_N, IS_TREE, HAS_WINDOW, PRECISION, NEW_KEYS, MASKLESS,
                )
        return m_i, l_i, acc

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, sq_b, sq_t, sq_h,  # q [B, T, H, hd]
        k_ptr, v_ptr, skv_tok, skv_h,  # layer rows [num_tokens + 1, Hkv, hd]
        bt_ptr, sbt,  # block tables [max_batch_size, blocks_per_seq]
        slots_ptr, cache_len_ptr,  # [B] each
        q_len_ptr, key_len_ptr, s_qlen, s_klen,  # [B] each (any stride): query rows, new key rows (key_len, or q_len)
        mask_ptr, sm_b, sm_t,  # packed tree mask [B, T, W] int32 (unused when not IS_TREE)
        pos_ptr, sp_b,  # RoPE positions [B, T] (unused without a window)
        o_ptr, so_s, so_b, so_t, so_h,  # out [B, T, H, hd], or partial [S, B, T, H, hd] fp32
        lse_ptr, sl_s, sl_b, sl_t,  # partial log-sum-exp [S, B, T, H] fp32 (NUM_SPLITS > 1)
        scale, window, T, HKV, G, ROWS, NUM_SPLITS, MAX_POS, MIN_KEYS,  # runtime ints: fewer specializations
        HD: tl.constexpr, HD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IS_TREE: tl.constexpr, HAS_WINDOW: tl.constexpr,
        PRECISION: tl.constexpr, INTERPRET: tl.constexpr, OFFS32: tl.constexpr, COMMITTED_FIRST: tl.constexpr,
        BLOCK_N_C: tl.constexpr, MASKLESS_C: tl.constexpr,
    ):
        b = tl.program_id(0) // HKV
        hkv = tl.program_id(0) % HKV
        tile = tl.program_id(1)
        split = tl.program_id(2)

        slot = tl.load(slots_ptr + b)
        cache_len = tl.load(cache_len_ptr + b)
        q_len = tl.load(q_len_ptr + b * s_qlen)
        n_new = tl.load(key_len_ptr + b * s_klen)  # new key rows: key_len (tree) or q_len

        m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query-head rows
        t = m // G
        h = hkv * G + m % G
        row_ok = (m < ROWS) & (t < q_len)
        d = tl.arange(0, HD_PAD)
        d_ok = d < HD
        q = tl.load(
            q_ptr + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + d[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [BLOCK_M, HD_PAD]
        if INTERPRET:  # the interpreter's 16-bit tl.dot is wrong (numpy has no bfloat16): dot in fp32
            q = q.to(tl.float32)

        # the tile's keys [first, end), from this row's real lengths (not from max_kv_len); a row with
        # no query rows (an idle slot) reads nothing: its committed length may be stale and its blocks
        # freed (a finished request's slot: its maskless committed tiles read before the cache)
        end = tl.where(q_len > 0, cache_len + n_new, 0)
        t_last = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, T - 1)
        if not IS_TREE:  # causal: keys past the tile's last row are invisible to all its rows
            end = tl.minimum(end, cache_len + t_last + 1)
        first = end * 0  # 0, as a tensor of end's type
        qpos = t  # placeholder when there is no window
        if HAS_WINDOW:
            qpos = tl.load(pos_ptr + b * sp_b + t, mask=row_ok, other=0)
            # committed keys older than every row's window are invisible to the whole tile
            qpos_min = tl.min(tl.where(row_ok, qpos, 1 << 62), axis=0)
            first = tl.maximum(first, tl.minimum(qpos_min - window + 1, cache_len))
        # split s of NUM_SPLITS: [first + s*L, first + (s+1)*L) within [first, end), L >= MIN_KEYS
        # and a multiple of both tile sizes (powers of two: of the larger); empty (an lse of -inf)
        # when the row has too few keys
        per_split = tl.maximum((end - first + NUM_SPLITS - 1) // NUM_SPLITS, MIN_KEYS)
        per_split = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        per_split = (per_split + BLOCK_N_C - 1) // BLOCK_N_C * BLOCK_N_C
        lo = first + split * per_split
        hi = tl.minimum(lo + per_split, end)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD_PAD], tl.float32)
        # COMMITTED_FIRST: whole BLOCK_N_C tiles of committed keys first (visible to every row:
        # the cheap tile; MASKLESS_C without a window: read with no masks at all), then the rest
        # in BLOCK_N tiles, which holds the new keys (tree mask or causal) and a partial
        # committed tile
        mid = lo
        if COMMITTED_FIRST:  # False: every tile takes the full visibility arithmetic (the A/B baseline)
            mid = lo + tl.maximum(tl.minimum(hi, cache_len) - lo, 0) // BLOCK_N_C * BLOCK_N_C
        if HAS_WINDOW:  # a window hides committed keys: the tiles keep their masks
            m_i, l_i, acc = _scan(
                lo, mid, q, m_i, l_i, acc, t, row_ok, d, d_ok, slot, cache_len, b, hkv, qpos,
                k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt, mask_ptr, sm_b, sm_t, pos_ptr, sp_b, scale, window, MAX_POS,
                BLOCK_SIZE, BLOCK_N_C, IS_TREE, HAS_WINDOW, PRECISION, OFFS32, False, INTERPRET, False,
            )
        else:
            m_i, l_i, acc = _scan(
                lo, mid, q, m_i, l_i, acc, t, row_ok, d, d_ok, slot, cache_len, b, hkv, qpos,
                k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt, mask_ptr, sm_b, sm_t, pos_ptr, sp_b, scale, window, MAX_POS,
                BLOCK_SIZE, BLOCK_N_C, IS_TREE, HAS_WINDOW, PRECISION, OFFS32, False, INTERPRET, MASKLESS_C,
            )
        m_i, l_i, acc = _scan(
            mid, hi, q, m_i, l_i, acc, t, row_ok, d, d_ok, slot, cache_len, b, hkv, qpos,
            k_ptr, v_ptr, skv_tok, skv_h, bt_ptr, sbt, mask_ptr, sm_b, sm_t, pos_ptr, sp_b, scale, window, MAX_POS,
            BLOCK_SIZE, BLOCK_N, IS_TREE, HAS_WINDOW, PRECISION, OFFS32, True, INTERPRET, False,
        )
        l_i = tl.where(row_ok, l_i, 0.0)  # padding rows (t >= q_len) see nothing: 0 out, lse -inf
        acc = tl.where(row_ok[:, None], acc, 0.0)

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # rows that saw nothing stay 0
        o_off = split * so_s + b * so_b + t[:, None] * so_t + h[:, None] * so_h + d[None, :]
        store_mask = (m < ROWS)[:, None] & d_ok[None, :]
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=store_mask)
        if SPLIT:
            lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
            tl.store(lse_ptr + split * sl_s + b * sl_b + t * sl_t + h, lse, mask=m < ROWS)

    _paged_attention_tuned = triton.autotune(
        configs=_autotune_configs(), key=["ROWS", "HD_PAD", "BLOCK_M", "IS_TREE", "SPLIT", "NUM_SPLITS"]
    )(_paged_attention_kernel)

    @triton.jit
    def _combine_kernel(
        part_ptr, sp_s, lse_ptr, sl_s, o_ptr, R,  # part [S, R, hd] fp32, lse [S, R] fp32, out [R, hd]
        HD: tl.constexpr, HD_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        """out[r] = sum_s exp(lse[s, r] - top) part[s, r] / sum_s exp(lse[s, r] - top): every
        split's partial of ROWS rows in one load (one memory round trip, not one per split);
        empty splits (lse -inf, weight 0) are not read."""
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [RB] rows
        r_ok = r < R
        s = tl.arange(0, SPLITS_PAD)
        d = tl.arange(0, HD_PAD)
        lse = tl.load(lse_ptr + s[:, None] * sl_s + r[None, :], mask=(s < NUM_SPLITS)[:, None] & r_ok[None, :],
                      other=float("-inf"))  # [S, RB]
        top = tl.max(lse, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)  # [RB]
        w = tl.exp(lse - top[None, :])  # [S, RB]; empty splits (lse -inf) weigh 0
        total = tl.sum(w, axis=0)  # [RB]
        part = tl.load(
            part_ptr + s[:, None, None] * sp_s + r[None, :, None] * HD + d[None, None, :],
            mask=(w > 0)[:, :, None] & (d < HD)[None, None, :],
            other=0.0,
        )  # [S, RB, HD_PAD]
        acc = tl.sum(part * w[:, :, None], axis=0)  # [RB, HD_PAD]
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        io_mask = r_ok[:, None] & (d < HD)[None, :]
        tl.store(o_ptr + r[:, None] * HD + d[None, :], out.to(o_ptr.dtype.element_ty), mask=io_mask)

    @triton_op("specdec::paged_attention", mutates_args={})
    def paged_attention_triton(
        q: torch.Tensor,  # [B, T, H, hd]
        k_rows: torch.Tensor,  # [num_tokens + 1, Hkv, hd]
        v_rows: torch.Tensor,
        block_tables: torch.Tensor,  # [max_batch_size, blocks_per_seq] int64
        slots: torch.Tensor,  # [B] int64
        cache_len: torch.Tensor,  # [B] int64
        q_len: torch.Tensor,  # [B] int64
        key_len: torch.Tensor | None,  # [B] int64 new key rows (tree mode), None = q_len
        tree_mask: torch.Tensor | None,  # [B, T, W] int32 or None (causal)
        positions: torch.Tensor | None,  # [B, T] int64, needed with a window
        block_size: int,
        scale: float,
        window: int,  # <= 0: no window
        num_splits: int,  # key splits, >= 1; static (does not follow the context length)
        min_split_keys: int,  # >= 1: a split scans at least this many keys (short contexts: fewer live splits)
        block_n: int,  # keys per tile without autotuning: 16, 32, 64 or 128 (`choose_block_n`)
        committed_block_n: int,  # keys per committed-keys-only tile, one of the same (`choose_committed_tile`)
        maskless_committed: bool,  # those whole tiles read without masks (ignored under a window)
        autotune: bool,
    ) -> torch.Tensor:
        """Attention of `q` over the paged layer `k_rows`/`v_rows`; returns [B, T, H, hd]."""
        B, T, H, hd = q.shape
        hkv = k_rows.shape[1]
        group = H // hkv
        rows = T * group
        block_m = _block_m(rows)
        hd_pad = max(16, triton.next_power_of_2(hd))
        max_pos = block_tables.shape[1] * block_size  # logical positions a block table can address
        is_tree = tree_mask is not None
        has_window = window > 0
        # the new-key counts through their own pointer and stride (a [2, B] stack of both lengths was
        # one more launch per call, eager inside the op: a draft depth's attention paid it every step;
        # a draft depth's lengths are strided views: `drafters.head_drafter._depth_inputs`)
        new_keys = q_len if key_len is None else key_len
        mask_arg = tree_mask if is_tree else cache_len
        pos_arg = positions if has_window else cache_len
        out = torch.empty((B, T, H, hd), device=q.device, dtype=q.dtype)
        if num_splits > 1:
            part = torch.empty((num_splits, B, T, H, hd), device=q.device, dtype=torch.float32)
            lse = torch.empty((num_splits, B, T, H), device=q.device, dtype=torch.float32)
            o_arg, o_strides = part, part.stride()[:4]
            l_arg, l_strides = lse, lse.stride()[:3]
        else:
            o_arg, o_strides = out, (0,) + out.stride()[:3]
            l_arg, l_strides = cache_len, (0, 0, 0)
        precision = "ieee" if q.dtype == torch.float32 else "tf32"
        # 32-bit K/V offsets when every element of the layer's rows is addressable in int32
        offs32 = max(k_rows.shape[0] * k_rows.stride(0), v_rows.shape[0] * v_rows.stride(0)) < 2**31
        grid = (B * hkv, triton.cdiv(rows, block_m), num_splits)
        if autotune:
            kernel, config = _paged_attention_tuned, {}
        else:
            kernel, config = _paged_attention_kernel, _fixed_config(block_n, committed_block_n, maskless_committed)
        wrap_triton(kernel)[grid](
            q, q.stride(0), q.stride(1), q.stride(2),
            k_rows, v_rows, k_rows.stride(0), k_rows.stride(1),
            block_tables, block_tables.stride(0),
            slots, cache_len,
            q_len, new_keys, q_len.stride(0), new_keys.stride(0),
            mask_arg, tree_mask.stride(0) if is_tree else 0, tree_mask.stride(1) if is_tree else 0,
            pos_arg, positions.stride(0) if has_window else 0,
            o_arg, *o_strides,
            l_arg, *l_strides,
            scale, window, T, hkv, group, rows, num_splits, max_pos, min_split_keys,
            HD=hd, HD_PAD=hd_pad, BLOCK_SIZE=block_size, BLOCK_M=block_m, SPLIT=num_splits > 1,
            IS_TREE=is_tree, HAS_WINDOW=has_window, PRECISION=precision, INTERPRET=_INTERPRET,
            OFFS32=offs32, **config,
        )
        if num_splits > 1:
            rows_per_program = _combine_rows()
            wrap_triton(_combine_kernel)[(triton.cdiv(B * T * H, rows_per_program),)](
                part, part.stride(0), lse, lse.stride(0), out, B * T * H,
                HD=hd, HD_PAD=hd_pad, NUM_SPLITS=num_splits, SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
                ROWS=rows_per_program, num_warps=1,
            )
        return out


def _block_m(rows: int) -> int:
    """Query-head rows per program: 16..64, a power of two."""
    return min(64, max(16, 1 << max(0, rows - 1).bit_length()))


def _heavy_tile(rows: int) -> bool:
    """Whether a program's tile holds >= 32 query rows (tree and prefill tiles; decode tiles
    hold fewer): the split rules below treat the two kinds differently."""
    return min(rows, _block_m(rows)) >= 32


def choose_num_splits(batch: int, kv_heads: int, rows: int, max_kv_len: int, num_sms: int) -> int:
    """Key splits so that the grid fills the GPU: >= 1, at most 32, and at most max_kv_len // 128
    for tree and prefill tiles, max_kv_len // 32 for decode tiles (the fewest keys a split
    scanned before `choose_min_split_keys` took head_dim into account; at head_dim 128 a tree
    tile's splits now take at least 256 keys, so under a short bound some stay empty). `rows`:
    query rows per (request, KV head), i.e. new tokens x heads of the GQA group, cut into
    `_block_m(rows)` tiles. Static sizes only, so one launch (one CUDA graph) serves every context length up
    to max_kv_len.

    Decode tiles (< 32 query rows per program) aim at 2 programs per SM (rounded up); tree and
    prefill tiles at most 2 per SM (rounded down). Tree and prefill
    tiles (>= 32 rows) are not split once the unsplit grid already holds a program per SM:
    each split re-reads the tile's queries and adds a combine, and a heavy tile per SM already
    keeps the GPU busy. Measured on the H200 (8B layout, context 256, N = 49, 32 layers):
    batch 8 tree verify, 256 programs, 1.09 ms unsplit vs 1.80 ms at the 2 splits the 2-per-SM
    target picked; batch 1, 32 programs, 2 splits stay best (0.71 vs 0.78 ms).

    Decode tiles split down to 32 keys (a 128-key cap for every tile before): on the H200 a
    batch-1 decode of the 8B layout at context 256 took 0.221 ms at 8 splits of 32 keys against
    0.337 at the 2 the 128-key cap allowed (`notes/gpu/issue20/ATTENTION.md`), and the SmolLM2
    layout (3 KV heads, context 320, bound 640) 0.175 ms at 16 splits against 0.208 at 5, at
    batch 8 0.225 against 0.261 (`attention_smollm2_splits_dcb5618_h200.log`)."""
    programs = batch * kv_heads * -(-rows // _block_m(rows))
    heavy = _heavy_tile(rows)
    if heavy and programs >= num_sms:
        return 1
    # heavy tiles: at most 2 programs per SM (a third wave for a few programs costs more than it
    # splits: H100, 8B tree N=61 at 4k under a 4224-key bound, 9 splits 1.180 ms, 8 0.983)
    want = 2 * num_sms // programs if heavy else -(-2 * num_sms // programs)
    return max(1, min(want, max_kv_len // (128 if heavy else 32), 32))


def choose_min_split_keys(rows: int, head_dim: int) -> int:
    """The fewest keys a split scans: the split count is static (from max_kv_len), so at a
    context far shorter than max_kv_len its splits would each get a handful of keys, every one
    re-reading the tile's queries and writing a partial for the combine. Splits then take at
    least this many keys and the rest stay empty. Tree and prefill tiles (>= 32 query rows):
    128 at head_dim <= 64, 256 above (below); decode tiles: 32. Measured on the H200 (8B
    layout, context 256, 32 layers): a batch-1 N = 49 tree verify was fastest at 128 keys per split (2 splits: 0.71 ms; 4: 0.75;
    8, i.e. 32 keys each: 0.85), a batch-1 decode at 32 keys per split (8 splits: 0.22 ms;
    2: 0.33). The floor itself measured neutral there (same layout, context 256 under a
    2048-key bound, 16 splits chosen: tree 0.867 vs 0.865 ms with a floor of 1 key, decode
    0.225 both; notes/gpu/issue20/attention_ctx256_max2048_712ced3.log): near-empty splits
    cost nothing measurable on the 8B layout. On the SmolLM2 layout (hd 64, 3 KV heads; tree
    N=49, context 320, bound 640, batch 1) floors of 32 / 64 / 128 keys measured 0.530 /
    0.533 / 0.534 ms per forward: neutral too (`attention_smollm2_splits_dcb5618_h200.log`).

    Since the committed keys go in 64-key maskless tiles (`choose_committed_tile`), tree and
    prefill tiles at head_dim > 64 take at least 256 keys: on an H100 (8B layout, tree N=61,
    batch 1, under the engine's 4224-key bound) at context 1k 0.676 ms against 0.864 at 128
    (8 splits, of which 5 get keys, against 9 of 128; 4 splits: 0.665), at 4k 0.989 against
    0.983, where the splits hold ~520 keys either way (`notes/gpu/issue20/splits_*_ad1b732_h100.log`)."""
    if not _heavy_tile(rows):
        return 32
    return 256 if head_dim > 64 else 128


BLOCK_NS = (16, 32, 64, 128)  # the key-tile sizes the kernel is built for without autotuning


def choose_block_n(rows: int, head_dim: int, is_tree: bool, max_kv_len: int) -> int:
    """Keys per tile (BLOCK_N) of the tiles that hold new keys (tree mask or causal), without
    autotuning: 64 for a prefill (>= 32 query rows, causal), else 16, the committed keys going
    in their own larger tiles (`choose_committed_tile`). Static sizes only, like the split
    count; `max_kv_len` no longer moves it (64 at hd 128 or past 1024 keys before the committed
    tiles had their own size).

    Measured on an H100 (graph ms per forward over all layers, bf16, batch 1 / 8; the launch as
    `examples/bench_attention.py --triton-configs` spells it, "c64m": 64-key committed tiles
    without masks; `notes/gpu/issue20/ab_*_9b66845_h100.log`):
    - 8B layout (32 layers, hd 128), tree N=61, context 1k: 64x4x2 (the choice before) 0.977 /
      2.173, 16x4x2 0.732 / 2.859, 16x4x2c64m 0.715 / 1.716; context 4k: 1.783 / 5.917, 2.218 /
      9.636, 1.191 / 5.201; its decode at 1k 0.313 / 0.686 against 0.275 / 0.624 at 16x4x2c64m
      (4k: 0.519 / 1.743, 0.460 / 1.670); its prefill keeps 64x4x2 (2.552 ms at 1k, 2.602 with
      maskless committed tiles, 3.506 at 16x4x2c64m);
    - SmolLM2 layout (30 layers, 3 KV heads, hd 64), tree N=49, context 320, bound 640:
      16x4x2 (the choice before) 0.405 / 0.587, 16x4x2c64m 0.368 / 0.520, 16x4x2c32m 0.374 /
      0.538; its decode 64x4x2 0.178 / 0.229, 16x4x2c32m 0.160 / 0.206, 16x4x2c64m 0.166 /
      0.213; its prefill 64x4x2 0.466, 64x4x2m 0.463."""
    if _heavy_tile(rows) and not is_tree:
        return 64
    return 16


def choose_committed_tile(rows: int, head_dim: int, is_tree: bool) -> tuple[int, bool]:
    """(keys per committed-keys-only tile, whether those whole tiles are read without masks):
    a prefill keeps its 64-key tiles with masks; a tree verify takes 64 maskless; decode tiles
    (< 32 query rows: decode, chain verify, a draft depth) 64 maskless at head_dim > 64, 32 at
    head_dim <= 64. Measured beside `choose_block_n` (its docstring has the table)."""
    if _heavy_tile(rows):
        return (64, True) if is_tree else (64, False)
    return (64 if head_dim > 64 else 32), True


def _check_positive(value, name: str, default: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1 (or None: {default})")


def paged_attention(q, cache, layer, batch, *, scale, sliding_window=None, num_splits=None, autotune=None,
                    min_split_keys=None, block_n=None):
    """`runtime.attention(..., impl="triton")`: see `attention_ref` for the arguments.

    `num_splits` forces the number of key splits (tests); None picks it from static sizes
    (`choose_num_splits`). `min_split_keys` forces the fewest keys a split scans (tests,
    benchmarks); None picks it from the tile (`choose_min_split_keys`). `block_n` forces the keys
    per tile without autotuning (tests; one of `BLOCK_NS`); None picks it (`choose_block_n`).
    The result does not depend on `batch.max_kv_len` (beyond fp rounding through the split
    count and the tile size): each split's key range follows the row's real key count on the
    device, so there is no host sync and a captured CUDA graph can be replayed
    for any context length up to max_kv_len.
    `autotune`: pick BLOCK_N / warps / stages by timing, once per shape family. Default off:
    the key holds the query-row count, so every new prompt-chunk length re-times six configs
    (seen on the H200: SmolLM2 at batch 1 ran at 75 tok/s, each new prompt paying ~1 s of
    autotuning), and a CUDA-graph warm-up on idle slots times nothing real anyway.
    """
    if autotune is None:
        autotune = False
    if not HAS_TRITON:
        raise RuntimeError("impl='triton' needs the triton package; use impl='ref'")
    check_batch(batch, sliding_window)
    out_dtype = q.dtype
    if q.dtype != cache.dtype:  # the kernel's dot takes one dtype: compute in the cache's
        q = q.to(cache.dtype)
    if q.stride(-1) != 1:
        q = q.contiguous()
    B, T, H, _ = q.shape
    hkv = cache.num_kv_heads[layer]
    rows = T * (H // hkv)  # query rows per (request, KV head)
    if num_splits is None:
        num_splits = choose_num_splits(B, hkv, rows, batch.max_kv_len, cache.num_sms)
    _check_positive(num_splits, "num_splits", "chosen from the grid size")
    if min_split_keys is None:
        min_split_keys = choose_min_split_keys(rows, q.shape[-1])
    _check_positive(min_split_keys, "min_split_keys", "chosen from the tile")
    if block_n is None:
        block_n = choose_block_n(rows, q.shape[-1], batch.tree_mask is not None, batch.max_kv_len)
    if type(block_n) is not int or block_n not in BLOCK_NS:
        raise ValueError(f"block_n={block_n!r} is not allowed; allowed: {', '.join(map(str, BLOCK_NS))} "
                         "(or None: chosen from the tile)")
    committed_block_n, maskless = choose_committed_tile(rows, q.shape[-1], batch.tree_mask is not None)
    positions = query_positions(batch) if sliding_window is not None else None
    out = paged_attention_triton(
        q,
        cache.k_rows(layer),
        cache.v_rows(layer),
        cache.block_tables,
        batch.slots,
        batch.cache_len,
        batch.q_len,
        batch.key_len,
        batch.tree_mask,
        positions,
        cache.block_size,
        float(scale),
        int(sliding_window or 0),
        num_splits,
        min_split_keys,
        block_n,
        committed_block_n,
        maskless,
        bool(autotune),
    )
    return out if out.dtype == out_dtype else out.to(out_dtype)
