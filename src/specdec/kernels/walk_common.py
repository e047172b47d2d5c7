"""The one tree walk every verifier shares, once per language: a Triton helper and a torch helper.

Every verifier walks the draft tree from the root over the first-child / next-sibling links
of `TreeMeta` (`next_token`, `next_sibling`), testing one child at a time:

    cur = root, cand = first child of cur
    while cand exists:
        accept?  (the verifier's rule: argmax match, rejection sampling, ...)
        yes -> append cand to the path, its token to the output; cur = cand, cand = first child
        no  -> cand = next sibling
    bonus token at cur (the verifier's rule)

This module owns that walk and the output layout (`specdec.types.Acceptance`):
accept_length [B] int64, accept_nodes [B, N] int64 (root first, then -1), accept_tokens
[B, N] int64 (accepted drafts, the bonus, then -1). The verifiers own only their rule.

- torch (the references): `TreeWalkRef`, B walks vectorized, one tested child per request
  per round, at most N - 1 rounds (eager: stops once every walk is done, one host sync per
  round; under torch.compile all N - 1 rounds run, no sync, no graph break).
- Triton (one program per request): `init_acceptance_row`, `walk_advance`, `walk_finish`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["TreeWalkRef", "empty_acceptance", "init_acceptance_row", "walk_advance", "walk_finish"]


def empty_acceptance(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh outputs for a batch shaped like `tokens` [B, N]: length 0, path [0, -1, ...]."""
    B, N = tokens.shape
    accept_length = torch.zeros(B, dtype=torch.int64, device=tokens.device)  # [B]
    accept_nodes = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)  # [B, N]
    accept_nodes[:, 0] = 0
    accept_tokens = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)  # [B, N]
    return accept_length, accept_nodes, accept_tokens


class TreeWalkRef:
    """B walks of the module docstring, vectorized over the batch (the references' loop).

    Usage: ``for live, c, x in walk.rounds(): accept = live & rule(c, x); ...;
    walk.advance(live, c, x, accept)``, then ``walk.finish(bonus)``.

    Attributes (all [B] int64 unless noted): `cur` (the node whose children are tested),
    `cand` (the child under test, -1 when exhausted), `accept_length`, `accept_nodes`
    [B, N], `accept_tokens` [B, N], `rows` (arange(B)).
    """

    def __init__(self, tokens: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor) -> None:
        self.tokens, self.next_token, self.next_sibling = tokens, next_token, next_sibling
        B, self.N = tokens.shape
        self.rows = torch.arange(B, device=tokens.device)
        self.accept_length, self.accept_nodes, self.accept_tokens = empty_acceptance(tokens)
        self.cur = torch.zeros(B, dtype=torch.int64, device=tokens.device)
        self.cand = next_token[:, 0].clone()

    def rounds(self):
        """Yield (live [B] bool, c [B] the child under test (0 where not live), x [B] its token
        (0 where not live)), at most N - 1 times."""
        for _ in range(self.N - 1):
            live = self.cand >= 0
            if not torch.compiler.is_compiling() and not bool(live.any()):
                break  # eager: stop when every walk is done (compiled: a fixed N - 1 rounds)
            c = self.cand.clamp(min=0)
            yield live, c, torch.where(live, self.tokens[self.rows, c], 0)

    def advance(self, live: torch.Tensor, c: torch.Tensor, x: torch.Tensor, accept: torch.Tensor) -> None:
        """Record the test of child c (token x): accepted -> appended, the walk descends to c;
        rejected (and live) -> its next sibling is tested next."""
        rows = self.rows
        n = self.accept_length + accept
        prev = (n - 1).clamp(min=0)
        self.accept_nodes[rows, n] = torch.where(accept, c, self.accept_nodes[rows, n])
        self.accept_tokens[rows, prev] = torch.where(accept, x, self.accept_tokens[rows, prev])
        self.accept_length = n
        self.cur = torch.where(accept, c, self.cur)
        self.cand = torch.where(accept, self.next_token[rows, c], torch.where(live, self.next_sibling[rows, c], self.cand))

    def finish(self, bonus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write the bonus token [B] after the accepted drafts; returns the `Acceptance` fields."""
        self.accept_tokens[self.rows, self.accept_length] = bonus
        return self.accept_length, self.accept_nodes, self.accept_tokens


@triton.jit
def init_acceptance_row(nodes_row, tokens_row, N, CHUNK: tl.constexpr = 64):
    """Write one request's "nothing accepted yet" rows: nodes [0, -1, ...], tokens all -1.

    Ends with a barrier, so the walk's later single-value stores to the same rows land last.
    """
    offs = tl.arange(0, CHUNK)
    k0 = 0
    while k0 < N:
        idx = k0 + offs
        tl.store(nodes_row + idx, tl.where(idx == 0, 0, -1).to(tl.int64), mask=idx < N)
        tl.store(tokens_row + idx, tl.full([CHUNK], -1, tl.int64), mask=idx < N)
        k0 += CHUNK
    tl.debug_barrier()


@triton.jit
def walk_advance(accept, cand, x, cur, n, nodes_row, out_row, nt_row, ns_row, N):
    """Record the test of child `cand` (token `x`) of `cur` for one request (the module docstring).

    Accepted (and the path has room: n < N - 1, which only malformed trees reach) -> append
    it (accept_nodes[n + 1] = cand, accept_tokens[n] = x) and descend; otherwise move to its
    next sibling. Returns (taken, cur, n, the next child to test or -1).
    """
    taken = accept & (n < N - 1)
    if taken:
        n += 1
        tl.store(nodes_row + n, cand)
        tl.store(out_row + n - 1, x)
        cur = cand
        nxt = tl.load(nt_row + cand)
    else:
        nxt = tl.load(ns_row + cand)
    return taken, cur, n, nxt


@triton.jit
def walk_finish(out_row, len_ptr, n, bonus):
    """Store the bonus / correction token after the n accepted drafts, and the length n."""
    tl.store(out_row + n, bonus)
    tl.store(len_ptr, n)
