"""`build_tree`: parent pointers -> `TreeMeta` (mask, positions, child/sibling lists).

Owns the public signature, shape checks and the optional (debug, host-syncing) validation
of the tree; the computation lives in `specdec.kernels.tree_build` (kernel and reference).
"""

from __future__ import annotations

import torch

from ..kernels.tree_build import build_tree_ref, build_tree_triton
from ..types import TreeMeta
from .dispatch import use_triton

__all__ = ["build_tree", "check_tree"]

_FIELDS = ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index")


def check_tree(parents: torch.Tensor, num_nodes: torch.Tensor) -> None:
    """Raise ValueError unless every row is a valid topological tree (syncs; for debugging).

    Args:
        parents: [B, N] int64; parents[b, 0] == -1 and 0 <= parents[b, i] < i for i < num_nodes[b].
        num_nodes: [B] int64 in [1, N].
    """
    B, N = parents.shape
    bad = ((num_nodes < 1) | (num_nodes > N)).nonzero()
    if len(bad):
        b = int(bad[0, 0])
        raise ValueError(f"num_nodes[{b}]={int(num_nodes[b])} is out of range; allowed: [1, {N}]")
    root = (parents[:, 0] != -1).nonzero()
    if len(root):
        b = int(root[0, 0])
        raise ValueError(f"parents[{b}, 0]={int(parents[b, 0])}; the root's parent must be -1")
    idx = torch.arange(N, device=parents.device)
    valid = (idx[None, :] < num_nodes[:, None]) & (idx[None, :] > 0)
    wrong = (valid & ((parents < 0) | (parents >= idx[None, :]))).nonzero()
    if len(wrong):
        b, i = (int(v) for v in wrong[0])
        raise ValueError(
            f"parents[{b}, {i}]={int(parents[b, i])} is out of range; allowed: [0, {i}) (nodes are in topological order)"
        )


def _check_out(out: TreeMeta, B: int, N: int, device: torch.device) -> None:
    want = {"packed_mask": ((B, N, (N + 31) // 32), torch.int32)}
    for name in _FIELDS:
        t = getattr(out, name)
        shape, dtype = want.get(name, ((B, N), torch.int64))
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != device or not t.is_contiguous():
            raise ValueError(
                f"out.{name} is {tuple(t.shape)} {t.dtype} on {t.device} (contiguous={t.is_contiguous()}); "
                f"expected contiguous {shape} {dtype} on {device} (use TreeMeta.empty)"
            )


def build_tree(
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    out: TreeMeta | None = None,
    impl: str = "auto",
    *,
    check: bool = False,
) -> TreeMeta:
    """Tree metadata for attention and verification.

    Args:
        parents: [B, N] int64, parent of each node (topological: parents[b, i] < i; root -1).
        num_nodes: [B] int64 in [1, N]; rows i >= num_nodes[b] are padding.
        out: preallocated buffers (`TreeMeta.empty(B, N)`) to overwrite entirely, or None.
        impl: "auto" | "triton" | "ref" (see `specdec.ops.dispatch`).
        check: validate the tree first with `check_tree` (host sync; for debugging).

    Returns:
        TreeMeta with packed_mask [B, N, ceil(N/32)] int32 (ancestor-or-self bits),
        positions [B, N] (depth), next_token / next_sibling [B, N] (first child, next
        sibling in ascending index order, -1 for none) and retrieve_index [B, N]
        (b * N + i, -1 for padding). Padding rows: self bit, position 0, links -1.
    """
    if parents.dim() != 2 or parents.dtype != torch.int64:
        raise ValueError(f"parents must be [B, N] int64, got {tuple(parents.shape)} {parents.dtype}")
    B, N = parents.shape
    if tuple(num_nodes.shape) != (B,) or num_nodes.dtype != torch.int64:
        raise ValueError(f"num_nodes must be [{B}] int64, got {tuple(num_nodes.shape)} {num_nodes.dtype}")
    if check:
        check_tree(parents, num_nodes)
    if out is None:
        out = TreeMeta.empty(B, N, device=parents.device)
    else:
        _check_out(out, B, N, parents.device)
    fn = build_tree_triton if use_triton(impl, parents) else build_tree_ref
    fn(parents.contiguous(), num_nodes.contiguous(), *(getattr(out, name) for name in _FIELDS))
    return out
