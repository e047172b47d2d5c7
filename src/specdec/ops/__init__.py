"""Tensor ops of one speculative step: tree metadata, sampling distributions, verification.

Each op dispatches (`impl="auto" | "triton" | "ref"`) to a Triton kernel in
`specdec.kernels` or to the plain PyTorch reference beside it.
"""

from .sampling import probs_for, sample_from_probs, sampling_probs
from .tree import build_tree, check_tree
from .verify import verify_greedy, verify_speculative, verify_target_only

__all__ = [
    "build_tree",
    "check_tree",
    "sampling_probs",
    "probs_for",
    "sample_from_probs",
    "verify_greedy",
    "verify_target_only",
    "verify_speculative",
]
