"""A request's life on the host: checked and queued (`submit`), admitted out of turn
(`add_request`), aborted, its tokens emitted with stops, EOS and `max_new_tokens` applied,
finished or failed, its slot, KV blocks and drafter state released.

A mixin of `SpecEngine`: it reads the engine's `config`, `runner`, `strategies`, `state`,
`scheduler` and `generator`.
"""

from __future__ import annotations

import torch

from ..config import ConfigError, SamplingParams
from ..runtime.kv_cache import KVCacheError
from ..validation import check_request
from .request import FINISHED, PREFILLING, WAITING, RequestState

__all__ = ["Lifecycle"]


class Lifecycle:
    """Submission, emission, finishing and release of requests (mixin)."""

    def check_request(self, prompt: list[int], params: SamplingParams, index: int | None = None) -> None:
        """Raise `ConfigError` if `prompt` / `params` cannot run (`validation.check_request`, plus
        the KV pool and draft-budget rules of this engine); touches no state."""
        check_request(
            prompt, params, vocab_size=self.runner.info.vocab_size, max_seq_len=self.config.cache.max_seq_len,
            max_positions=self.model_context, lookahead=self.lookahead,
            greedy_only=self.strategies.verifier_caps.greedy_only, index=index,
        )
        where = "" if index is None else f"prompt {index}: "
        need = len(prompt) + params.max_new_tokens + self.lookahead
        if self.pool_positions is not None and need > self.pool_positions:
            raise ConfigError(
                where + f"the request needs {need} KV positions but the whole pool holds {self.pool_positions} "
                "(num_kv_blocks * kv_block_size); raise num_kv_blocks"
            )
        budget = params.num_draft_tokens
        if (budget not in (None, 0) and budget < self.sizes.draft_budget and self.strategies.drafter_caps.samples_drafts
                and not self.chain):
            raise ConfigError(
                where + f"num_draft_tokens={budget}: a sampled draft tree keeps whole sibling groups, so with "
                f"verifier={self.config.verifier!r} and tree={self.config.tree!r} a request drafts all "
                f"{self.sizes.draft_budget} tokens or none (num_draft_tokens None or 0)"
            )

    def submit(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """Queue a request (checked first); it is admitted between steps when a slot and KV are free."""
        self.check_request(prompt, params)
        return self.enqueue(prompt, params)

    def enqueue(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """`submit` for a request its caller has checked (`check_request`) already: the decoder,
        the async engine and the server check every request once, before any of them runs."""
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self.generator))
        full = self.sizes.draft_budget
        budget = full if params.num_draft_tokens is None else min(params.num_draft_tokens, full)
        request = RequestState(
            id=self._next_id, prompt=list(prompt), params=params, seed=seed, budget=budget,
            max_positions=len(prompt) + params.max_new_tokens + self.lookahead,
        )
        self._next_id += 1
        self.scheduler.enqueue(request)
        return request

    @torch.inference_mode()
    def add_request(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """Submit and admit now: prefill `prompt` into the lowest free slot and sample its first token."""
        self.check_request(prompt, params)
        if not self.free_slots():
            raise ConfigError(f"all {self.config.cache.max_batch_size} request slots are busy (max_batch_size)")
        request = self.submit(prompt, params)
        self.scheduler.dequeue(request)
        self.scheduler.enqueue(request, front=True)
        if not self._admit_one():
            self.scheduler.dequeue(request)
            raise KVCacheError(f"the KV pool cannot back a prompt of {len(prompt)} tokens now; free finished requests")
        while request.status == PREFILLING:
            self._prefill_step(request)
        return request

    def abort(self, request: RequestState) -> None:
        """Stop a request now (finish reason "aborted"), releasing its slot, blocks and drafter state."""
        if request.status == FINISHED:
            return
        if request.status == WAITING:
            self.scheduler.dequeue(request)
        self._finish(request, "aborted")

    def abort_all(self, reason: str = "aborted", error: str | None = None) -> None:
        """End every unfinished request (an interrupt, a failed step): nothing stays held."""
        for request in list(self.waiting) + [r for r in self.slots if r is not None]:
            if request.status == WAITING:
                self.scheduler.dequeue(request)
            self._finish(request, reason, error)

    def _emit(self, request: RequestState, new_tokens: list[int]) -> None:
        """Append tokens, cutting at EOS / stop tokens / max_new_tokens; free finished slots."""
        params = request.params
        if request.end_ids is None:  # (stop ids, EOS ids), once per request
            request.end_ids = (frozenset(params.stop_token_ids),
                               frozenset() if params.ignore_eos else frozenset(self.eos_token_ids))
        stops, eos = request.end_ids
        self._touch(request)
        tokens = request.token_ids
        if len(tokens) + len(new_tokens) < params.max_new_tokens and stops.isdisjoint(new_tokens) \
                and eos.isdisjoint(new_tokens):  # the common step: nothing ends the request
            tokens.extend(new_tokens)
            return
        for tok in new_tokens:
            tokens.append(tok)
            reason = "stop" if tok in stops else "eos" if tok in eos else None
            if reason is None and len(tokens) >= params.max_new_tokens:
                reason = "length"
            if reason is not None:
                self._finish(request, reason)
                return

    def _touch(self, request: RequestState) -> None:
        """`request` goes into this iteration's `touched` (once)."""
        if request.id not in self._touched_ids:
            self._touched_ids.add(request.id)
            self.touched.append(request)

    def _release(self, request: RequestState) -> None:
        """Give back the slot, its KV blocks and the drafter's per-slot state."""
        slot = request.slot
        if not self.scheduler.leave(request):  # `request.slot` keeps the number (finished requests report it)
            return
        self.state.active[slot].fill_(False)  # no stream sync (`_set_sampling`)
        self.runner.free(slot)
        self._backed[slot] = 0
        self.strategies.drafter.reset_slot(slot)

    def _finish(self, request: RequestState, reason: str, error: str | None = None) -> None:
        request.status, request.finish_reason, request.error = FINISHED, reason, error
        self._release(request)
        self._touch(request)

    def _fail(self, requests: list[RequestState], err: BaseException) -> None:
        message = f"{type(err).__name__}: {err}"
        for request in requests:
            if request.status != FINISHED:
                self._finish(request, "error", message)
