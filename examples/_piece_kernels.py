"""The GPU kernels of recorded compiled-piece calls, generated on the CPU (a child of
`count_launches.py --kernels`; run WITHOUT TRITON_INTERPRET).

A compiled piece (`torch.compile(fn, dynamic=True, fullgraph=True)`, as the decoder compiles
it) runs on the GPU as the Triton kernels Inductor generates for it plus its extern calls
(matmuls, `topk`, ...). Inductor's Triton code generation is the same for CPU tensors when
`cpu_backend="triton"`: the scheduler fuses the same nodes into the same kernels (combo
kernels, off by default, aside). So each recorded call is compiled that way, the generated
module's source is taken when it is complete, and its launches are counted; the kernels
themselves are never built (the compile-only driver of tests/_sm90_compile.py stands in for a
GPU while the code is generated, and the build for a CPU target then fails, as expected).

    python _piece_kernels.py RECORDS.pt [--combo] [NAME=VALUE ...]   # one JSON line per record: kernels, names

--combo compiles with Inductor's combo kernels (`ExecutionConfig.combo_kernels`); Inductor
groups nodes into combo kernels only on GPUs, so here its grouping is run without the CPU
exclusion (the same windows of up to `combo_kernel_max_num_nodes` nodes in graph order).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _sm90_compile  # noqa: E402,F401  (sets the compile-only sm_90 driver)
import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
from torch._inductor.graph import GraphLowering  # noqa: E402

from specdec.compile_scope import compile_private  # noqa: E402

inductor_config.cpu_backend = "triton"
inductor_config.fx_graph_cache = False  # a cached graph is loaded, not generated: its source would be missed
_SOURCES: list[str] = []
_compile_to_module = GraphLowering.compile_to_module


def _keep_source(self):
    """Keep the generated module's source, then go on (the build for the CPU target fails)."""
    code = self.codegen()[0]
    _SOURCES.append(getattr(code, "value", str(code)))
    return _compile_to_module(self)


GraphLowering.compile_to_module = _keep_source
_RUN = re.compile(r"^\s+(\w+)\.run\(", re.M)  # a Triton kernel launched by the wrapper
_EXTERN = re.compile(r"(extern_kernels\.\w+|aten\.\w+(?:\.\w+)?|torch\.ops\.\w+\.\w+(?:\.\w+)?)\(")


def kernels_of(fn, args, kwargs) -> list[str] | None:
    """The launches of `fn`'s compiled graph for these arguments (None: no code was generated)."""
    _SOURCES.clear()
    try:
        compile_private(fn, dynamic=True, fullgraph=True)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the kernels cannot be built for a CPU target; the source is what counts
        pass
    if not _SOURCES:
        return None
    names = []
    for src in _SOURCES:
        call = src[src.find("def call("):] if "def call(" in src else src
        names += _RUN.findall(call) + _EXTERN.findall(call)
    return names


def _count_user_kernels() -> None:
    """A piece that launches Triton kernels of its own on CUDA (`ops.top_logprobs`, k > 1; a ranked
    policy's call, `policies.shapes._ranked_call`) takes
    its PyTorch path on CPU tensors; here it takes the kernels' path, each kernel an opaque op
    (one launch in the generated `call()`) with the kernel's output shapes."""
    import specdec.ops.top_logprobs as ops_top

    def chunk_shapes(x: torch.Tensor, k: int, chunks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        R = x.shape[0]  # each chunk's k best values and tokens, its max and its sum
        return (x.new_empty(R, chunks, k), x.new_empty(R, chunks, k, dtype=torch.int64),
                x.new_empty(R, chunks), x.new_empty(R, chunks))

    def merge_shapes(val: torch.Tensor, tok: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor,
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tok.new_empty(val.shape[0], k), val.new_empty(val.shape[0], k)  # the row's k tokens and log-probabilities

    # the stand-ins only shape their outputs, so one function is both the op and its fake
    chunk_top = torch.library.custom_op("specdec_count::chunk_top_kernel", chunk_shapes, mutates_args=())
    chunk_top.register_fake(chunk_shapes)
    merge_top = torch.library.custom_op("specdec_count::merge_top_kernel", merge_shapes, mutates_args=())
    merge_top.register_fake(merge_shapes)

    def kernels_path(x, k, chunks):
        return merge_top(*chunk_top(x, k, chunks), k)

    ops_top._runs_triton = lambda impl, logits: True
    ops_top.top_logprobs_triton = kernels_path

    import specdec.policies.shapes as shapes  # a ranked policy's call: `kernels.ranked_call`, one kernel

    def ranked_shapes(fr_score: torch.Tensor, logq: torch.Tensor, tokens: torch.Tensor, fr_hist: torch.Tensor, width: int,
                      offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor, torch.Tensor]:
        B, M = logq.shape[0], logq.shape[1] * logq.shape[2]  # the history [B, M], the next frontier [B, width]
        f32 = dict(dtype=torch.float32)
        return (logq.new_empty(B, M, **f32), tokens.new_empty(B, M), tokens.new_empty(B, M), tokens.new_empty(B, width),
                logq.new_empty(B, width, **f32), tokens.new_empty(B, width), tokens.new_empty(B, width))

    ranked = torch.library.custom_op("specdec_count::ranked_call_kernel", ranked_shapes, mutates_args=())
    ranked.register_fake(ranked_shapes)
    shapes._ranked_kernel_takes = lambda impl, logq, width: True
    shapes.ranked_call_triton = ranked


def _combo_groups(scheduler) -> list:
    """Inductor's default grouping for combo kernels, CPU nodes included."""
    size = inductor_config.combo_kernel_max_num_nodes
    return [nodes[i : i + size] for nodes in scheduler._topological_sort_nodes() for i in range(0, len(nodes), size)]


def main() -> None:
    import torch.fx.experimental._config as fx_config
    from torch._inductor import scheduler

    fx_config.use_duck_shape = False  # as `models.fused.compiled` sets it
    if "--combo" in sys.argv:
        inductor_config.combo_kernels = True
        scheduler.ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels = staticmethod(_combo_groups)
    for arg in sys.argv[2:]:  # NAME=VALUE: an Inductor option (int values), e.g. score_fusion_memory_threshold=1
        if "=" in arg:
            name, value = arg.split("=", 1)
            setattr(inductor_config, name, int(value))
    _count_user_kernels()
    records = torch.load(sys.argv[1], weights_only=False)
    seen: dict = {}
    for module, qualname, args, kwargs, signature in records:
        if signature not in seen:
            fn = importlib.import_module(module)
            for part in qualname.split("."):
                fn = getattr(fn, part)
            seen[signature] = kernels_of(fn, args, kwargs)
        names = seen[signature]
        print(json.dumps(dict(kernels=None if names is None else len(names), names=names)), flush=True)


if __name__ == "__main__":
    main()
