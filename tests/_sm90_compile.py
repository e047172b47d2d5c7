"""Compile every Triton kernel for an H100/H200 (sm_90) exactly as its launcher launches it, without a GPU.

The CPU suite runs the kernels in Triton's interpreter, which checks what a kernel computes
but not whether the GPU compiler accepts it. This script goes through the real launchers
(`verify_greedy_triton`, `paged_attention_triton`, ...) with CPU tensors of real shapes, so
Triton's JIT specializes the arguments as it would on the GPU (an int argument equal to 1
becomes a constant, one divisible by 16 gets an alignment hint; kernels that opt out with
`do_not_specialize` are compiled a second time fully specialized, as torch.compile's
Inductor launches them), and compiles each
specialization to a cubin with Triton's bundled ptxas. Nothing is launched: a stand-in driver
names the sm_90 target and every launch stops after compiling.

Run in a process WITHOUT TRITON_INTERPRET (the tests do that), one family per argument:

    python tests/_sm90_compile.py verify tree kv attention linear

Prints one `ok FAMILY CASE` line per launch and `compiled:FAMILY` when a family is done;
the first compile error ends the run with its message and the case that raised it.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: interpreted kernels cannot be compiled")

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TREE_SIZES = (1, 2, 33, 64, 257)  # N: 1 is a constant to the JIT, 64 divisible by 16, the rest plain
VOCABS = (49152, 128256, 151936, 1001)  # SmolLM2 / Llama 3 / Qwen, and an odd size


class _CompileOnlyDriver:
    """Enough of a Triton driver for the JIT to pick sm_90 and compile; it never launches."""

    def is_active(self) -> bool:
        return True

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


driver.set_active(_CompileOnlyDriver())
_run = JITFunction.run
LAST: dict = {}  # kernel name -> its latest compiled kernel (PTX and cubin in `.asm`)


_AS_INDUCTOR: dict = {}  # kernel -> its copy that specializes every argument (as torch.compile launches it)


def _compile_only(self, *args, grid, warmup, **kwargs):
    """Every launch compiles (and checks the cubin exists) but does not run.

    A kernel with `do_not_specialize` arguments is compiled twice: as the JIT launches it,
    and as a kernel inside a torch.compile graph is launched. Inductor ignores
    `do_not_specialize` and makes every int argument equal to 1 a constant (its
    `equal_to_1` rule), so a one-node tree (N = 1) in a whole-step graph compiles the
    specialized kernel (seen on the H200: compile="step" failed in `_verify_greedy_kernel`)."""
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    assert kernel is not None and kernel.asm.get("cubin"), self.fn.__name__
    LAST[self.fn.__name__] = kernel
    if self.do_not_specialize:
        clone = _AS_INDUCTOR.setdefault(self, JITFunction(self.fn))
        kernel = _run(clone, *args, grid=grid, warmup=True, **kwargs)
        assert kernel is not None and kernel.asm.get("cubin"), self.fn.__name__ + " (specialized as torch.compile does)"
    return kernel


JITFunction.run = _compile_only

from specdec.kernels import fused_linear, kv_relocate, kv_write, ranked_call, rope_kv_write, small_linear  # noqa: E402
from specdec.kernels import tree_attention, tree_build  # noqa: E402
from specdec.kernels import top_logprobs, verify_greedy, verify_speculative, verify_target_only  # noqa: E402
from specdec.ops.top_logprobs import chunk_count  # noqa: E402

I64 = torch.int64


def _walk_inputs(B: int, N: int):
    tokens = torch.zeros(B, N, dtype=I64)
    return tokens, torch.full((B, N), -1, dtype=I64), torch.full((B, N), -1, dtype=I64)


def verify() -> None:
    """The three verifiers (and greedy from a precomputed argmax) at every N x V x dtype."""
    B = 2
    for N in TREE_SIZES:
        walk = _walk_inputs(B, N)
        uniforms = torch.empty(B, N, 2, dtype=torch.float64)
        verify_greedy.verify_greedy_triton(*walk, torch.zeros(B, N, dtype=I64))
        print(f"ok verify greedy-argmax N={N}")
        for V in VOCABS:
            for dtype in (torch.float32, torch.bfloat16):
                rows = torch.empty(B, N, V, dtype=dtype)
                verify_greedy.verify_greedy_triton(*walk, rows)
                verify_target_only.verify_target_only_triton(*walk, rows, uniforms)
                verify_speculative.verify_speculative_triton(*walk, rows, rows, uniforms.float())
                # bit-exactness with the reference needs IEEE float64 division
                assert "div.rn.f64" in LAST["_verify_speculative_kernel"].asm["ptx"]
                print(f"ok verify greedy/target-only/speculative N={N} V={V} {dtype}")


def tree() -> None:
    for B in (1, 3):
        for N in TREE_SIZES:
            W = -(-N // 32)
            outs = [torch.empty(B, N, W, dtype=torch.int32)] + [torch.empty(B, N, dtype=I64) for _ in range(4)]
            tree_build.build_tree_triton(torch.zeros(B, N, dtype=I64), torch.ones(B, dtype=I64), *outs)
            print(f"ok tree build B={B} N={N}")
    # a tree drafter's k best children per frontier row (rows = B x F), at the draft vocabularies
    for rows in (1, 8, 60):
        for V in (16384, 32000) + VOCABS[:3]:
            for k in (2, 8, 10, 16):
                for dtype in (torch.bfloat16, torch.float32):
                    x = torch.empty(rows, V, dtype=dtype)
                    top_logprobs.top_logprobs_triton(x, k, chunk_count(V, k))
            print(f"ok top logprobs rows={rows} V={V}")
    # a ranked policy's call: (batch, frontier F, children K, next width) of dynamic trees (K = 8, 10)
    for B, F, K, width in ((1, 1, 8, 8), (1, 8, 8, 8), (4, 10, 10, 10), (2, 8, 8, 1), (1, 64, 64, 64)):
        ranked_call.ranked_call_triton(torch.empty(B, F), torch.empty(B, F, K), torch.empty(B, F, K, dtype=I64),
                                       torch.empty(B, F, dtype=I64), width, 1 + K)
        print(f"ok ranked call B={B} F={F} K={K} width={width}")


def kv() -> None:
    """K/V row writes (rows = 1 or many, widths of real models) and the relocation over all layers."""
    for rows in (1, 2, 61):
        for width, dtype in ((64 * 3, torch.bfloat16), (128 * 8, torch.bfloat16), (64 * 5, torch.float32)):
            storage = torch.empty(2 * 100 * width, dtype=dtype)
            new = torch.empty(rows, width, dtype=dtype)
            kv_write.kv_write_triton(storage, 0, 100 * width, 99, new, new, torch.zeros(rows, dtype=I64))
            print(f"ok kv write rows={rows} width={width} {dtype}")
        for (H, Hkv, hd), dtype in (((9, 3, 64), torch.bfloat16), ((32, 8, 128), torch.bfloat16), ((4, 2, 64), torch.float32)):
            q = torch.empty(rows, H, hd, dtype=dtype)
            storage = torch.empty(2 * 100 * Hkv * hd, dtype=dtype)
            new = torch.empty(rows, Hkv * hd, dtype=dtype)
            cos = torch.empty(rows, hd, dtype=dtype)
            rope_kv_write.rope_kv_write_triton(q, storage, 0, 100 * Hkv * hd, 99, q.view(rows, -1), new, new, cos, cos,
                                               torch.zeros(rows, dtype=I64))
            print(f"ok rope + kv write rows={rows} heads={H}/{Hkv}x{hd} {dtype}")
    for B in (1, 4):
        for P in TREE_SIZES:
            for dtype in (torch.bfloat16, torch.float32):
                storage = torch.empty(4096, dtype=dtype)
                kv_relocate.relocate_kv_triton(
                    storage, torch.zeros(3, dtype=I64), torch.full((3,), 192, dtype=I64), torch.zeros(B, 8, dtype=I64),
                    torch.zeros(B, dtype=I64), torch.zeros(B, P, dtype=I64), torch.zeros(B, dtype=I64), 16, 128, 192,
                )
                print(f"ok kv relocate B={B} P={P} {dtype}")


# (dtype, heads / KV heads / head dim, batch, query rows T, tree mask, key splits, window): the
# launches the engine makes (decode and the one-node target-only tree at T = 1, chains and
# trees, prefill chunks), on the SmolLM2 (9/3/64) and Llama-3-8B (32/8/128) head layouts.
ATTENTION_CASES = (
    (torch.bfloat16, (32, 8, 128), 1, 1, True, 4, 0),
    (torch.bfloat16, (32, 8, 128), 1, 1, False, 1, 0),
    (torch.bfloat16, (32, 8, 128), 4, 1, True, 1, 0),
    (torch.bfloat16, (32, 8, 128), 1, 2, True, 1, 0),
    (torch.bfloat16, (32, 8, 128), 1, 61, True, 4, 0),
    (torch.bfloat16, (32, 8, 128), 2, 7, False, 1, 32),
    (torch.float32, (9, 3, 64), 1, 1, True, 4, 0),
    (torch.float32, (9, 3, 64), 3, 6, True, 1, 0),
    (torch.float32, (9, 3, 64), 1, 33, False, 1, 0),
    (torch.bfloat16, (9, 3, 64), 1, 257, True, 2, 0),
)


def attention() -> None:
    """Paged attention at the launches of `ATTENTION_CASES` (the split-KV combine with them)."""
    block_size, blocks = 16, 8
    for dtype, (H, hkv, hd), B, T, tree_rows, splits, window in ATTENTION_CASES:
        k_rows = torch.empty(blocks * block_size + 1, hkv, hd, dtype=dtype)
        slots, cache_len = torch.arange(B, dtype=I64), torch.zeros(B, dtype=I64)
        q = torch.empty(B, T, H, hd, dtype=dtype)
        q_len = torch.full((B,), T, dtype=I64)
        mask = torch.zeros(B, T, -(-T // 32), dtype=torch.int32) if tree_rows else None
        positions = torch.zeros(B, T, dtype=I64) if window else None
        tree_attention.paged_attention_triton(
            q, k_rows, k_rows, torch.zeros(B, blocks, dtype=I64), slots, cache_len, q_len, q_len if tree_rows else None,
            mask, positions, block_size, 0.125, window, splits, 32,
            tree_attention.choose_block_n(T * (H // hkv), hd, tree_rows, blocks * block_size),
            *tree_attention.choose_committed_tile(T * (H // hkv), hd, tree_rows), False,
        )
        print(f"ok attention {dtype} H={H}/{hkv} hd={hd} B={B} T={T} tree={tree_rows} splits={splits} window={window}")
    # a draft tree's depth: its lengths are strided [B] views (columns of [B, F] tensors, `_depth_inputs`)
    for dtype in (torch.bfloat16, torch.float32):
        for B, F in ((1, 8), (4, 10)):
            k_rows = torch.empty(blocks * block_size + 1, 3, 64, dtype=dtype)
            lens = torch.full((B, F), F, dtype=I64)
            tree_attention.paged_attention_triton(
                torch.empty(B, F, 9, 64, dtype=dtype), k_rows, k_rows, torch.zeros(B, blocks, dtype=I64),
                torch.arange(B, dtype=I64), torch.zeros(B, dtype=I64), lens[:, 0], (lens + 8)[:, 0],
                torch.zeros(B, F, 1, dtype=torch.int32), None, block_size, 0.125, 0, 4, 32,
                tree_attention.choose_block_n(F * 3, 64, True, blocks * block_size),
                *tree_attention.choose_committed_tile(F * 3, 64, True), False,
            )
            print(f"ok attention {dtype} draft depth B={B} F={F} (strided lengths)")
    # the launch variants `examples/bench_attention.py --triton-configs` times (committed keys in
    # their own tile size, masked or not) at the two tree-verify layouts
    fixed = tree_attention._fixed_config
    variants = ((64, 64, False), (32, 64, True), (16, 32, False))  # beside the chosen ones above
    for (H, hkv, hd), T in (((32, 8, 128), 61), ((9, 3, 64), 49)):
        for block_n, block_n_c, maskless in variants:
            config = dict(BLOCK_N=block_n, BLOCK_N_C=block_n_c, MASKLESS_C=maskless, num_warps=4, num_stages=2,
                          COMMITTED_FIRST=True)
            tree_attention._fixed_config = lambda *_, c=config: dict(c)
            try:
                k_rows = torch.empty(blocks * block_size + 1, hkv, hd, dtype=torch.bfloat16)
                q_len = torch.full((1,), T, dtype=I64)
                tree_attention.paged_attention_triton(
                    torch.empty(1, T, H, hd, dtype=torch.bfloat16), k_rows, k_rows, torch.zeros(1, blocks, dtype=I64),
                    torch.zeros(1, dtype=I64), torch.zeros(1, dtype=I64), q_len, q_len,
                    torch.zeros(1, T, -(-T // 32), dtype=torch.int32), None, block_size, 0.125, 0, 2, 128, block_n,
                    block_n_c, maskless, False,
                )
            finally:
                tree_attention._fixed_config = fixed
            print(f"ok attention variant {block_n}c{block_n_c}{'m' if maskless else ''} H={H}/{hkv} hd={hd} T={T}")


def linear() -> None:
    """The few-row projections at the shipped models' shapes (SmolLM2's qkv and down, its EAGLE-3
    head's fc, a vocabulary head of 2^31+ weight elements' row offsets) and an odd one, 1 to 8 rows;
    the fused norm / SwiGLU projections (`kernels.fused_linear`) at SmolLM2's."""
    for (N, K), dtype in (((960, 576), torch.bfloat16), ((576, 1536), torch.bfloat16), ((576, 1728), torch.float32),
                          ((49152, 576), torch.bfloat16), ((7, 3), torch.float16)):
        for M in (1, 3, 8):
            bias = torch.empty(N, dtype=dtype) if M == 3 else None
            small_linear.small_linear_triton(torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype), bias)
            print(f"ok small linear M={M} N={N} K={K} {dtype} bias={bias is not None}")
    # the fused ones at SmolLM2's norm -> qkv / gate_up and SwiGLU -> down, and an odd shape
    for (N, K), dtype in (((960, 576), torch.bfloat16), ((3072, 576), torch.bfloat16), ((7, 3), torch.float32)):
        for M in (1, 8):
            x, w = torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype)
            fused_linear.norm_linear_triton(x, x, torch.empty(K, dtype=dtype), 1e-5, w, None)
            fused_linear.rms_norm_linear_triton(x, torch.empty(K, dtype=dtype), 1e-5, w, None)
            print(f"ok norm linear M={M} N={N} K={K} {dtype}")
    for (N, K), dtype in (((576, 1536), torch.bfloat16), ((5, 6), torch.float16)):
        for M in (1, 8):
            fused_linear.swiglu_linear_triton(torch.empty(M, 2 * K, dtype=dtype), torch.empty(N, K, dtype=dtype), None)
            print(f"ok swiglu linear M={M} N={N} K={K} {dtype}")


FAMILIES = {"verify": verify, "tree": tree, "kv": kv, "attention": attention, "linear": linear}

if __name__ == "__main__":
    for family in sys.argv[1:] or sorted(FAMILIES):
        FAMILIES[family]()
        print(f"compiled:{family}", flush=True)
