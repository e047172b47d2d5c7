"""`specdec_build_tree`: the built-in tree builder (parents -> `TreeMeta`) for every config.

Chains and dynamic trees use the same op, `specdec.ops.build_tree`: a chain's metadata is
cheap to build, and rebuilding it each step keeps per-request `num_nodes` (idle slots,
shorter drafts) exact.
"""

from __future__ import annotations

import torch

from specdec.hookspecs import hookimpl
from specdec.ops import build_tree
from specdec.types import TreeMeta


class TreeBuilder:
    """`(parents [B, N] int64, num_nodes [B] int64, out=TreeMeta | None) -> TreeMeta`."""

    def __init__(self, impl: str = "auto") -> None:
        self.impl = impl

    def __call__(self, parents: torch.Tensor, num_nodes: torch.Tensor, out: TreeMeta | None = None) -> TreeMeta:
        return build_tree(parents, num_nodes, out=out, impl=self.impl)


@hookimpl
def specdec_build_tree(config):
    return TreeBuilder()
