"""The pointwise pieces of a decoder layer (norms, residual adds, RoPE, SwiGLU's activation),
as plain functions that run eagerly or through `torch.compile`.

Why pieces and not the whole forward: eager PyTorch launches every pointwise op on its own
(a Llama layer is ~40 launches), and torch.compile fuses each piece into one or two kernels.
Compiled with `dynamic=True`, one compiled piece serves every batch size, tree width and
prompt chunk (no recompilation when a new shape arrives, except the usual 0/1 size
specialization, which `SpecDecoder.warmup` exercises), and it stays a small graph that
compiles in seconds. Matmuls and attention stay outside (cuBLAS, the Triton kernel); the
engine then captures the whole step, compiled pieces included, in a CUDA graph.

Each module that uses these holds a `fused` attribute (`EAGER` by default), a `Pieces` that
flattens the row dimensions before the call, so a compiled piece sees [rows, ...] inputs;
`use_compiled` switches every such module under a root to the compiled `Pieces`. The eager
and compiled pieces run the same Python code, so eager stays the reference the tests
compare with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.compile_scope import compile_private
from specdec.kernels.rope_kv_write import rotate_half

__all__ = ["EAGER", "Pieces", "compiled", "use_compiled", "rms_norm", "add_rms_norm", "norm_cat", "rotary_qk",
           "rotary_cos_sin", "silu_mul"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF-exact RMSNorm: normalize in float32, cast back, then scale. x: [..., d]."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """The residual add and the next norm: (x + delta, rms_norm(x + delta)), both [..., d]."""
    h = x + delta
    return h, rms_norm(h, weight, eps)


def norm_cat(a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, eps_a: float,
             eps_b: float):
    """Two RMSNorms side by side: (cat([rms_norm(a), rms_norm(b)], -1) [..., 2d], rms_norm(b) [..., d])
    (an EAGLE-3 layer's input: normed embeddings beside normed hidden states).

    With one eps (every shipped head) the two are one normalization over [..., 2, d], so Inductor
    makes the piece one reduction kernel where the two norms and the cat were two (one launch
    fewer per draft forward); each row's arithmetic is rms_norm's, so the values are the same."""
    if eps_a != eps_b or a.dtype != b.dtype or weight_a.dtype != weight_b.dtype:
        nb = rms_norm(b, weight_b, eps_b)
        return torch.cat([rms_norm(a, weight_a, eps_a), nb], dim=-1), nb
    first = torch.arange(2, device=a.device)[:, None] == 0  # [2, 1]: a where True
    pair = torch.where(first, a[..., None, :], b[..., None, :])  # [..., 2, d] (pointwise: no stacked copy)
    both = rms_norm(pair, torch.where(first, weight_a, weight_b), eps_a)  # [..., 2, d]
    both = both.flatten(-2)  # [..., 2d]
    return both, both[..., a.shape[-1]:]


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """RoPE on queries [B, T, H, hd] and keys [B, T, Hkv, hd]; cos, sin: [B, T, 1, hd]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
    """positions [B, T] int64 -> cos, sin [B, T, 1, hd] in `dtype` (frequencies in float32)."""
    freqs = positions[..., None].float() * inv_freq.float()  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, hd]
    cos = (emb.cos() * scaling).to(dtype)
    sin = (emb.sin() * scaling).to(dtype)
    return cos[:, :, None, :], sin[:, :, None, :]


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the fused projection [..., 2f] -> silu(gate) * up [..., f]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


_FUNCTIONS = dict(
    rms_norm=rms_norm,
    add_rms_norm=add_rms_norm,
    norm_cat=norm_cat,
    rotary_qk=rotary_qk,
    rotary_cos_sin=rotary_cos_sin,
    silu_mul=silu_mul,
)


class Pieces:
    """The pieces with flattened row dimensions: every call sees [rows, ...] tensors whose
    trailing sizes are fixed per model, so a compiled piece needs one graph for rows == 1 and
    one for rows > 1 (dynamic=True still specializes sizes 0 and 1), whatever the batch,
    tree width or chunk length."""

    def __init__(self, fns: dict, compiled: bool) -> None:
        self.fns, self.compiled = fns, compiled

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.fns["rms_norm"](x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
        d = x.shape[-1]
        h, normed = self.fns["add_rms_norm"](x.reshape(-1, d), delta.reshape(-1, d), weight, eps)
        return h.view(x.shape), normed.view(x.shape)

    def norm_cat(self, a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, eps_a: float,
                 eps_b: float):
        d = a.shape[-1]
        both, nb = self.fns["norm_cat"](a.reshape(-1, d), b.reshape(-1, d), weight_a, weight_b, eps_a, eps_b)
        return both.view(*a.shape[:-1], 2 * d), nb.view(b.shape)

    def rotary_qk(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        rows = q.shape[:-2]
        q2, k2 = self.fns["rotary_qk"](
            q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]),
            cos.reshape(-1, 1, cos.shape[-1]), sin.reshape(-1, 1, sin.shape[-1]),
        )
        return q2.view(*rows, *q.shape[-2:]), k2.view(*rows, *k.shape[-2:])

    def rotary_cos_sin(self, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
        cos, sin = self.fns["rotary_cos_sin"](positions.reshape(1, -1), inv_freq, scaling, dtype)  # [1, R, 1, hd]
        shape = (*positions.shape, 1, cos.shape[-1])
        return cos.view(shape), sin.view(shape)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = self.fns["silu_mul"](gate_up.reshape(-1, gate_up.shape[-1]))
        return out.view(*gate_up.shape[:-1], out.shape[-1])


EAGER = Pieces(_FUNCTIONS, compiled=False)


def compiled() -> Pieces:
    """The same pieces through `torch.compile(dynamic=True, fullgraph=True)`: a new set per
    call, for one owner (a decoder), with graphs of its own (`specdec.compile_scope`).

    Duck sizing is turned off for the process: with it, dynamo gives two dimensions that
    happen to be equal when a piece is first traced one symbol (a 3-row prefill chunk and
    a model's 3 KV heads), and a later chunk of another length recompiles. Without it every
    dimension keeps its own symbol; that only makes graphs more general."""
    import torch.fx.experimental._config as fx_config

    if hasattr(fx_config, "use_duck_shape"):
        fx_config.use_duck_shape = False
    fns = {name: compile_private(fn, dynamic=True, fullgraph=True) for name, fn in _FUNCTIONS.items()}
    return Pieces(fns, compiled=True)


def use_compiled(root: nn.Module, on: bool = True, *, pieces: Pieces | None = None) -> nn.Module:
    """Switch every module under `root` that has a `fused` namespace to `pieces` (default: new
    compiled pieces when `on`, else the eager ones); returns `root`. A decoder passes one
    `compiled()` set to its target and its draft modules."""
    if pieces is None:
        pieces = compiled() if on else EAGER
    for module in root.modules():
        if hasattr(module, "fused"):
            module.fused = pieces
    return root
