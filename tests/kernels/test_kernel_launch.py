"""`specdec.kernels.launch.wrap_triton`: compiled kernels go through torch's `wrap_triton`
(traceable by torch.compile), interpreted ones launch directly. torch 2.11 (the GPU
machine's) refuses interpreted kernels in its `wrap_triton`, torch 2.13 (CI's) accepts them;
the tests below emulate the stricter one, so CI catches a launch that would fail on 2.11
(on the H200, every `--quick` CPU bench under TRITON_INTERPRET=1 once failed that way)."""

import importlib
import pkgutil

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

import specdec.kernels
from specdec.kernels import launch
from specdec.kernels.kv_write import kv_write_torch, kv_write_triton
from tree_cases import DEVICE


def _strict_torch_wrap(kernel):
    """torch 2.11's rule: only JIT functions and autotuners (of JIT functions) are wrapped."""
    inner = kernel.fn if isinstance(kernel, Autotuner) else kernel
    if not isinstance(inner, JITFunction):
        raise RuntimeError("wrap_triton only works on functions annotated with triton.jit or triton.autotune")
    return ("wrapped", kernel)


def _modules():
    """(name, module) of every module of specdec.kernels."""
    for info in pkgutil.iter_modules(specdec.kernels.__path__):
        yield info.name, importlib.import_module(f"specdec.kernels.{info.name}")


def _kernels():
    for module_name, module in _modules():
        for name, obj in vars(module).items():
            if name.startswith("_") and name.endswith("_kernel"):
                yield f"{module_name}.{name}", obj


def test_every_kernel_module_launches_through_the_helper():
    for name, module in _modules():
        if hasattr(module, "wrap_triton") and name != "launch":
            assert module.wrap_triton is launch.wrap_triton, f"{name} imports torch's wrap_triton directly"


def test_every_kernel_is_wrapped_when_compiled_and_launched_as_is_when_interpreted(monkeypatch):
    monkeypatch.setattr(launch, "_torch_wrap_triton", _strict_torch_wrap)
    kernels = dict(_kernels())
    assert len(kernels) >= 9, sorted(kernels)  # every kernel module's kernels were found
    for name, kernel in kernels.items():
        got = launch.wrap_triton(kernel)
        if isinstance(launch._innermost(kernel), JITFunction):
            assert got == ("wrapped", kernel), name
        else:
            assert got is kernel, name


def test_a_kernel_launches_under_the_stricter_torch_rule(monkeypatch):
    monkeypatch.setattr(launch, "_torch_wrap_triton", lambda k: _strict_torch_wrap(k)[1])
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 3, 8, generator=gen).to(DEVICE)
    base = torch.randn(2 * 5 * 8, generator=gen).to(DEVICE)  # K and V regions of 4 rows + a sink
    index = torch.tensor([2, -1, 0], device=DEVICE)
    ref, out = base.clone(), base.clone()
    kv_write_torch(ref, 0, 40, 4, k, v, index)
    kv_write_triton(out, 0, 40, 4, k, v, index)
    for region in (out, ref):  # the sink rows (4 and 9) take padding; never read
        region.view(10, 8)[[4, 9]] = 0
    assert torch.equal(out, ref)
