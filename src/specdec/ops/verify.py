"""Verifiers: turn target outputs on a draft tree into an `Acceptance`.

Owns the public signatures, shape checks and the random draws; the walks live in
`specdec.kernels.verify_greedy`, `verify_target_only` and `verify_speculative` (each a
Triton kernel beside its PyTorch reference; read their docstrings for the exact rules).

Random draws: `uniforms` [B, N, 2] in [0, 1) (float32 or float64). uniforms[b, i, 0] is the
coin used when node i is tested as a child; uniforms[b, i, 1] draws the bonus / correction
token when the walk ends at node i. Pass `uniforms` to replay draws exactly, or a
`generator` (then `torch.rand(B, N, 2, dtype=float64, generator=generator)` is drawn here),
or neither (the default generator). Kernel and reference give the same integers for the same
draws.

Draft tokens of valid non-root nodes must lie in [0, V): the kernels read target (and
draft) rows at them. Padding nodes and the root's token are never read.

Glossary: accepted = draft nodes on the verified path; bonus = the token the target emits
after the last accepted node (a correction when some child there was rejected).
"""

from __future__ import annotations

import torch

from ..kernels.verify_greedy import verify_greedy_ref, verify_greedy_triton
from ..kernels.verify_speculative import verify_speculative_ref, verify_speculative_triton
from ..kernels.verify_target_only import verify_target_only_ref, verify_target_only_triton
from ..types import Acceptance, TreeMeta
from .dispatch import use_triton

__all__ = ["verify_greedy", "verify_target_only", "verify_speculative"]

# Greedy verification on logits takes every row's argmax first (one wide reduction over the
# device) when the logits hold at most this many elements, and leaves the argmax to the kernel's
# walk otherwise. The walk computes one row per visited depth in one program per request: ~7 us
# a 49152-wide bf16 row on an H200 (28 us of a chain step's verify and 32 of a tree's at
# dcb5618), while the wide argmax reads every row, ~0.03 us a row at the device's bandwidth: it
# wins up to ~600-900 rows (B x N) at that width (estimated; 2^25 elements = 683 such rows, e.g.
# a chain of 6 rows at batch 64, a tree of 49 at batch 8, not at 16). One node (target-only):
# the walk reads its one row, so the kernel keeps it and no launch is added.
ARGMAX_FIRST_MAX_ELEMENTS = 1 << 25


def _check_tree_args(tokens: torch.Tensor, tree: TreeMeta) -> tuple[int, int]:
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be [B, N] int64, got {tuple(tokens.shape)} {tokens.dtype}")
    for name in ("next_token", "next_sibling"):
        t = getattr(tree, name)
        if t.shape != tokens.shape or t.dtype != torch.int64:
            raise ValueError(f"tree.{name} must be {tuple(tokens.shape)} int64 like tokens, got {tuple(t.shape)} {t.dtype}")
    return tokens.shape


def _check_probs(name: str, probs: torch.Tensor, B: int, N: int) -> None:
    if probs.dim() != 3 or tuple(probs.shape[:2]) != (B, N) or not probs.is_floating_point():
        raise ValueError(f"{name} must be [{B}, {N}, V] float, got {tuple(probs.shape)} {probs.dtype}")


def _draws(B: int, N: int, device, generator, uniforms) -> torch.Tensor:
    if uniforms is not None and generator is not None:
        raise ValueError("pass either uniforms= (explicit draws) or generator=, not both")
    if uniforms is None:
        return torch.rand(B, N, 2, generator=generator, device=device, dtype=torch.float64)
    if tuple(uniforms.shape) != (B, N, 2) or uniforms.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"uniforms must be [{B}, {N}, 2] float32 or float64, got {tuple(uniforms.shape)} {uniforms.dtype}")
    return uniforms.contiguous()


def _acceptance(result) -> Acceptance:
    accept_length, accept_nodes, accept_tokens = result
    return Acceptance(accept_length=accept_length, accept_nodes=accept_nodes, accept_tokens=accept_tokens)


def verify_greedy(tokens: torch.Tensor, tree: TreeMeta, target: torch.Tensor, *, impl: str = "auto") -> Acceptance:
    """Accept the child whose token is the target's argmax, node by node from the root.

    Args:
        tokens: [B, N] int64 node tokens (node 0 = root).
        tree: `build_tree` output for these nodes (its next_token / next_sibling are walked).
        target: [B, N, V] logits (any float dtype) or [B, N] int64 precomputed argmax.
        impl: "auto" | "triton" | "ref" (see `specdec.ops.dispatch`).

    Returns:
        Acceptance; on duplicate sibling tokens the first sibling wins.
    """
    B, N = _check_tree_args(tokens, tree)
    if target.dim() == 2:
        if tuple(target.shape) != (B, N) or target.dtype != torch.int64:
            raise ValueError(f"an argmax target must be [{B}, {N}] int64, got {tuple(target.shape)} {target.dtype}")
    else:
        _check_probs("target logits", target, B, N)
    triton = use_triton(impl, tokens)
    if triton and target.dim() == 3 and 1 < N and target.numel() <= ARGMAX_FIRST_MAX_ELEMENTS:
        target = target.argmax(-1)  # [B, N] int64; same ties as the kernel (the first maximum)
    fn = verify_greedy_triton if triton else verify_greedy_ref
    return _acceptance(fn(tokens.contiguous(), tree.next_token.contiguous(), tree.next_sibling.contiguous(), target.contiguous()))


def verify_target_only(
    tokens: torch.Tensor,
    tree: TreeMeta,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    impl: str = "auto",
) -> Acceptance:
    """Tree rejection sampling with target probabilities only (SGLang / EAGLE rule).

    Exact (emitted tokens follow the target) for distinct children fixed before the draws;
    repeated sibling tokens are skipped. See `specdec.kernels.verify_target_only`.

    Args:
        tokens: [B, N] int64 node tokens.
        tree: `build_tree` output.
        target_probs: [B, N, V] float, `sampling_probs` of the target logits.
        generator / uniforms: the random draws (module docstring).
        impl: "auto" | "triton" | "ref" (see `specdec.ops.dispatch`).
    """
    B, N = _check_tree_args(tokens, tree)
    _check_probs("target_probs", target_probs, B, N)
    u = _draws(B, N, tokens.device, generator, uniforms)
    fn = verify_target_only_triton if use_triton(impl, tokens) else verify_target_only_ref
    return _acceptance(fn(tokens.contiguous(), tree.next_token.contiguous(), tree.next_sibling.contiguous(), target_probs.contiguous(), u))


def verify_speculative(
    tokens: torch.Tensor,
    tree: TreeMeta,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    impl: str = "auto",
) -> Acceptance:
    """Standard speculative sampling, with recursive rejection over sampled siblings.

    Exact when each node's children were drawn i.i.d. from that node's draft row.
    See `specdec.kernels.verify_speculative`.

    Args:
        tokens: [B, N] int64 node tokens.
        tree: `build_tree` output.
        target_probs: [B, N, V] float, `sampling_probs` of the target logits.
        draft_probs: [B, N, V] float; row i is the distribution node i's children were
            sampled from (rows of leaves and padding are not read).
        generator / uniforms: the random draws (module docstring).
        impl: "auto" | "triton" | "ref" (see `specdec.ops.dispatch`).
    """
    B, N = _check_tree_args(tokens, tree)
    _check_probs("target_probs", target_probs, B, N)
    if draft_probs is None or draft_probs.shape != target_probs.shape or not draft_probs.is_floating_point():
        got = None if draft_probs is None else (tuple(draft_probs.shape), draft_probs.dtype)
        raise ValueError(f"draft_probs must be float {tuple(target_probs.shape)} like target_probs, got {got}")
    u = _draws(B, N, tokens.device, generator, uniforms)
    fn = verify_speculative_triton if use_triton(impl, tokens) else verify_speculative_ref
    return _acceptance(
        fn(tokens.contiguous(), tree.next_token.contiguous(), tree.next_sibling.contiguous(), target_probs.contiguous(), draft_probs.contiguous(), u)
    )
