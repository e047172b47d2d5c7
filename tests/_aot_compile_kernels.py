"""Compile the paged-KV Triton kernels for an H100/H200 (sm_90) ahead of time, without a GPU.

The interpreter (CPU tests) checks what a kernel computes, not whether it compiles: this
script lowers the real GPU code path (`INTERPRET=False`) to PTX and cubin with Triton's
bundled ptxas, so GPU-only compile errors fail on CPU too. Run in a process WITHOUT
TRITON_INTERPRET (the tests do that):

    python tests/_aot_compile_kernels.py attention relocate
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: interpreted kernels cannot be compiled")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec.kernels import kv_relocate, tree_attention  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(fn, types: dict, constexprs: dict, **options) -> None:
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    consts = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts), target=TARGET, options=options)
    assert compiled.asm["cubin"], fn.__name__
    print(f"ok {fn.__name__} {constexprs} {options}")


def attention() -> None:
    kernel = tree_attention._paged_attention_kernel
    ptrs = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", bt_ptr="*i64", slots_ptr="*i64", cache_len_ptr="*i64",
                q_len_ptr="*i64", mask_ptr="*i32", pos_ptr="*i64", lse_ptr="*fp32", scale="fp32")
    # every constexpr branch: tree+window+split (fp32 partials) and causal decode without split
    for is_tree, window, split, block_m in ((True, True, True, 64), (False, False, False, 16)):
        types = dict(ptrs, o_ptr="*fp32" if split else "*bf16")
        compile_kernel(
            kernel, types,
            dict(HD=128, HD_PAD=128, BLOCK_SIZE=16, BLOCK_M=block_m, BLOCK_N=64, SPLIT=split, IS_TREE=is_tree,
                 HAS_WINDOW=window, PRECISION="tf32", INTERPRET=False),
            num_warps=4, num_stages=2,
        )
    compile_kernel(tree_attention._combine_kernel, dict(part_ptr="*fp32", lse_ptr="*fp32", o_ptr="*bf16"),
                   dict(HD=128, HD_PAD=128, NUM_SPLITS=6, SPLITS_PAD=8), num_warps=4)


def relocate() -> None:
    types = dict(storage_ptr="*bf16", region_offsets_ptr="*i64", row_widths_ptr="*i64", block_tables_ptr="*i64",
                 committed_ptr="*i64", nodes_ptr="*i64", length_ptr="*i64")
    compile_kernel(kv_relocate._relocate_kernel, types,
                   dict(P=6, BLOCK_SIZE=16, BLOCKS_PER_SEQ=136, BLOCK_J=8, BLOCK_D=1024), num_warps=4)


if __name__ == "__main__":
    for name in sys.argv[1:] or ("attention", "relocate"):
        {"attention": attention, "relocate": relocate}[name]()
