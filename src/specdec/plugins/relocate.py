"""Built-in `specdec_relocate_kv`: paged KV relocation for every config.

Owns only the choice of relocator; the kernel and its reference live in
`specdec.kernels.kv_relocate`. Works for any attention layout the cache holds (layers
with different KV head counts, sliding-window layers: relocation moves whole token rows,
the window is applied by attention's mask).
"""

from __future__ import annotations

import torch

from specdec.hookspecs import hookimpl
from specdec.kernels.kv_relocate import relocate_kv


class PagedRelocator:
    """``(cache, committed_len [B], accept_nodes [B, N], accept_length [B]) -> None``.

    Reads only the first ``max_draft_len + 1`` path entries (accept_length <= max_draft_len),
    so the kernel's tile is sized by the draft depth, not by the tree width. A path of one
    entry (root-only trees: target-only, plain steps) is the root, already where it belongs:
    nothing is launched (decided on the static shape, so a captured step holds no branch).
    """

    def __init__(self, max_path: int, impl: str = "auto") -> None:
        self.max_path = max_path
        self.impl = impl

    def __call__(self, cache, committed_len: torch.Tensor, accept_nodes: torch.Tensor, accept_length: torch.Tensor):
        path = accept_nodes[:, : self.max_path]  # [B, P]
        if path.shape[1] <= 1:  # the root alone: it stays at committed_len
            return
        relocate_kv(cache, committed_len, path, accept_length, impl=self.impl)

    def __repr__(self) -> str:
        return f"PagedRelocator(max_path={self.max_path}, impl={self.impl!r})"


@hookimpl(trylast=True)
def specdec_relocate_kv(config):
    """The paged relocator for any config (registered last, so a third party may override it)."""
    return PagedRelocator(max_path=config.shape.max_draft_len + 1)
