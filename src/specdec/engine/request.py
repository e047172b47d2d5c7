"""`RequestState`: the host-side record of one request, from submission to its finish reason.

Owns the life cycle a request goes through in the engine:

    waiting --admit--> prefilling --last chunk--> running --stop/EOS/length--> finished
       ^                                              |
       +---------------- preempted (KV pool short) ---+

and what a caller reads: the tokens so far, the draft tokens accepted at each step, the
finish reason (`stop`, `eos`, `length`, `aborted`, `error` with `error` holding the message).
A preempted request keeps its tokens; on re-admission its prompt and the tokens it already
emitted are prefilled again (its KV is recomputed) and it continues where it stopped, with
the same tokens it would have produced unpreempted (draws are keyed by position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import SamplingParams

if TYPE_CHECKING:
    from .adaptive import DepthAcceptance

__all__ = ["RequestState", "FINISH_REASONS", "WAITING", "PREFILLING", "RUNNING", "FINISHED"]

WAITING, PREFILLING, RUNNING, FINISHED = "waiting", "prefilling", "running", "finished"
FINISH_REASONS = ("stop", "eos", "length", "aborted", "error")


@dataclass(eq=False)
class RequestState:
    """One request. Fields a caller reads: `token_ids`, `accepted_per_step`, `budget_per_step`,
    `finish_reason`, `error`; the rest is the engine's bookkeeping."""

    id: int
    prompt: list[int]
    params: SamplingParams
    seed: int  # key of the counter-based draws (the params' seed, or one drawn at submission)
    budget: int  # draft tokens this request verifies per step (0 = none)
    max_positions: int  # the most positions it can ever hold (prompt + new tokens + lookahead)
    slot: int | None = None
    status: str = WAITING
    token_ids: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)  # draft tokens accepted each step
    budget_per_step: list[int] = field(default_factory=list)  # draft tokens verified each step
    finish_reason: str | None = None
    error: str | None = None
    committed: int = 0  # tokens with target KV (host copy of StepState.committed_len)
    prefilled: int = 0  # tokens of `prefill_tokens` already prefilled (this admission)
    admitted: int = -1  # admission counter (the youngest running request is preempted first)
    preemptions: int = 0
    acceptance: "DepthAcceptance | None" = None  # per-depth acceptance estimate (adaptive speculation)
    end_ids: tuple[frozenset, frozenset] | None = None  # (stop ids, EOS ids), made by the engine's first emit
    tag: object = None  # the submitter's handle (e.g. `AsyncEngine`'s stream), never read by the engine

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    @property
    def prefill_tokens(self) -> list[int]:
        """What admission prefills: the prompt, and after a preemption the tokens emitted so far
        except the newest (that one becomes the root again, its KV not cached)."""
        return self.prompt + self.token_ids[:-1]
