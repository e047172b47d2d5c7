"""The tree-op kernels compile for an H100/H200 (sm_90) on any machine, GPU or not.

The CPU suite runs the kernels in Triton's interpreter, which accepts code the GPU compiler
rejects (loop-carried values changing type, scalar control flow it cannot lower). Compiling
ahead of time to a cubin catches that class of error without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import triton

from specdec.kernels import tree_build, verify_greedy, verify_speculative, verify_target_only

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import triton.backends.nvidia.compiler  # noqa: F401  (the CUDA backend and its ptxas)
except ImportError as err:  # pragma: no cover - a Triton build without the CUDA backend
    pytest.skip(f"Triton's CUDA backend is not installed ({err}); nothing to compile for", allow_module_level=True)

I64, I32 = "*i64", "i32"
WALK = dict(tokens_ptr=I64, next_tok_ptr=I64, next_sib_ptr=I64)
OUTS = dict(len_ptr=I64, nodes_ptr=I64, out_tok_ptr=I64, N=I32, V=I32)

WARPS = {"verify_greedy_logits": 16, "verify_target_only": 16}  # as the launchers use
CASES = {
    "build_tree": (
        tree_build._build_tree_kernel,
        dict(parents_ptr=I64, num_nodes_ptr=I64, mask_ptr="*i32", pos_ptr=I64, next_tok_ptr=I64, next_sib_ptr=I64, ridx_ptr=I64, N=I32, W=I32),
        dict(BLOCK_R=32, BLOCK_C=64, BLOCK_W=8),
    ),
    "verify_greedy_logits": (
        verify_greedy._verify_greedy_kernel,
        dict(**WALK, target_ptr="*bf16", **OUTS),
        dict(FROM_ARGMAX=False, BLOCK_V=8192),
    ),
    "verify_greedy_argmax": (
        verify_greedy._verify_greedy_kernel,
        dict(**WALK, target_ptr=I64, **OUTS),
        dict(FROM_ARGMAX=True, BLOCK_V=8192),
    ),
    "verify_target_only": (
        verify_target_only._verify_target_only_kernel,
        dict(**WALK, probs_ptr="*fp32", u_ptr="*fp64", **OUTS),
        dict(BLOCK_V=4096),
    ),
    "verify_speculative": (
        verify_speculative._verify_speculative_kernel,
        dict(**WALK, probs_ptr="*fp32", draft_ptr="*fp32", u_ptr="*fp32", scratch_ptr="*fp32", **OUTS),
        dict(BLOCK_V=4096),
    ),
}


def compile_case(name: str) -> None:
    fn, signature, constexprs = CASES[name]
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=WARPS.get(name, 8)))
    assert len(compiled.asm["cubin"]) > 0, name
    if name == "verify_speculative":  # bit-exactness with the reference needs IEEE float64 division
        assert "div.rn.f64" in compiled.asm["ptx"], name


def test_tree_kernels_compile_for_sm90():
    # A subprocess: under TRITON_INTERPRET=1 (set by conftest on CPU) `triton.jit` yields
    # interpreter objects that cannot be compiled.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, __file__, *sorted(CASES)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.split() == [f"compiled:{name}" for name in sorted(CASES)]


if __name__ == "__main__":
    for case in sys.argv[1:]:
        compile_case(case)
        print(f"compiled:{case}")
