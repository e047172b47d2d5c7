"""Chunked, grouped prefill of the target and the drafter, and each request's first token.

`config.schedule.prefill_chunk_size` padded prompt tokens per forward: the next chunks of several
prefilling requests share one target forward (a GPU prefill costs mostly launches; the group
rule is the scheduler's), a long prompt takes one chunk of it, then the drafter's chunks and,
for a last chunk, the first tokens (drawn together, one host sync). With graphs on, a prefill
whose chunks all start at position 0 replays the CUDA graph of its padded (requests, length)
bucket, target and draft head (`use_prefill_buckets`, `runtime.bucket_graphs`). A request
whose prefill fails fails alone.

A mixin of `SpecEngine`: it reads the engine's `config`, `runner`, `strategies`, `state`,
`scheduler`, `device` and host lists, and calls its `_emit` / `_fail`.
"""

from __future__ import annotations

import torch

from ..config import SpecConfig
from ..ops import sample_from_probs, sampling_probs
from ..ops.random import STREAM_FIRST_TOKEN, counter_uniforms
from ..runtime.host_copy import to_device
from .request import RUNNING, RequestState

__all__ = ["Prefill", "use_prefill_buckets"]


class Prefill:
    """The engine's prefill path (mixin)."""

    def _advance_prefills(self) -> None:
        """Prefill chunks, oldest request first, `prefill_chunk_size` padded prompt tokens per
        forward: several prompts share one forward (`_prefill_group`), a long one takes one
        chunk of it. Forwards follow each other while `Scheduler.prefill_more` says so: while
        fewer requests run than wait for their prefill, and up to `prefill_tokens_per_step`
        prompt tokens an iteration. Why: with one forward per iteration (the rule before), a
        speculative decoder, which finishes requests in a third of the steps, refilled its
        slots slower than they emptied and ran half-empty (SmolLM2 on the H200, batch 64:
        ~32 of 64 slots running per bucket-64 step of the EAGLE-3 chain, ~51 for
        target-only; 0.84x target-only's throughput, `notes/gpu/issue22/bench_smollm2_32cbac7.log`)."""
        budget = self.config.schedule.prefill_tokens_per_step
        size = self.config.schedule.prefill_chunk_size
        prefilling, spent = self._prefilling(), 0
        while prefilling:
            group = self._prefill_group(prefilling)
            spent += self.scheduler.chunk_tokens(group, size)
            if len(group) > 1:
                self._prefill_together(group)
            else:
                self._prefill_step(group[0])
            prefilling = self._prefilling()
            if not self.scheduler.prefill_more(len(self.running()), len(prefilling), spent, budget):
                return

    def _prefilling(self) -> list[RequestState]:
        """Requests admitted but not yet running, oldest first."""
        return self.scheduler.prefilling()

    def _prefill_group(self, prefilling: list[RequestState]) -> list[RequestState]:
        """The requests whose next chunks share the next forward (`Scheduler.prefill_group`)."""
        return self.scheduler.prefill_group(prefilling, self.config.schedule.prefill_chunk_size,
                                            grouped=hasattr(self.runner, "prefill_many"),
                                            buckets=getattr(self.runner, "prefill_buckets", None))

    def _prefill_step(self, request: RequestState) -> None:
        try:
            self._prefill_chunk(request)
        except Exception as err:  # this request fails; the others go on
            self._fail([request], err)

    def _prefill_together(self, group: list[RequestState]) -> None:
        """One target forward for the next chunk of every request in `group`, then each
        request's drafter chunk and, for a last chunk, its first token (drawn together, one
        host sync). A failing forward is retried request by request, so only a request that
        fails alone fails."""
        size = self.config.schedule.prefill_chunk_size
        seqs = list(to_device([t for r in group for t in r.prefill_tokens], self.device).split(
            [len(r.prefill_tokens) for r in group]))  # one copy for the group's prompts
        starts = [r.prefilled for r in group]
        ends = [min(start + size, seq.shape[0]) for start, seq in zip(starts, seqs)]
        try:
            logits, hidden = self.runner.prefill_many(
                [r.slot for r in group], [seq[a:e] for seq, a, e in zip(seqs, starts, ends)], starts)  # [n, V]
        except Exception:
            for request in group:
                self._prefill_step(request)
            return
        done = [i for i, r in enumerate(group) if ends[i] == seqs[i].shape[0] and not r.token_ids]
        first = {}
        if done:
            rows = logits if len(done) == len(group) else logits.index_select(0, to_device(done, logits.device))  # [k, V]
            drawn = self._first_tokens([group[i] for i in done], rows, [seqs[i].shape[0] for i in done])
            first = dict(zip(done, drawn))
        drafted = False  # the drafter's chunks in one forward too, when it can (`prefill_many`)
        drafting = [i for i, r in enumerate(group) if r.budget != 0]  # a request that drafts nothing skips it
        if hidden is not None and drafting and hasattr(self.strategies.drafter, "prefill_many"):
            def pick(items: list) -> list:  # the drafting requests' entries
                return [items[i] for i in drafting]

            try:
                nexts = self._next_tokens_many(pick(group), pick(seqs), pick(starts), pick(ends),
                                               {j: first[i] for j, i in enumerate(drafting) if i in first})
                self.strategies.drafter.prefill_many([r.slot for r in pick(group)], nexts, pick(hidden), pick(starts))
                drafted = True
            except Exception:  # retried request by request below
                drafted = False
        for i, request in enumerate(group):
            h = None if hidden is None else hidden[i]
            try:
                self._finish_chunk(request, seqs[i], starts[i], ends[i], h, first.get(i), drafted=drafted)
            except Exception as err:  # this request fails; the others go on
                self._fail([request], err)

    def _next_tokens(self, request: RequestState, seq: torch.Tensor, start: int, end: int, first: int | None) -> torch.Tensor:
        """The tokens the drafter pairs with chunk [start, end) of `seq`: each position's next
        token, the last chunk's last one being the first generated token (`first`, or the
        known root of a request re-admitted after a preemption)."""
        return self._next_tokens_many([request], [seq], [start], [end], {0: first})[0]

    def _next_tokens_many(self, group: list[RequestState], seqs: list[torch.Tensor], starts: list[int],
                          ends: list[int], first: dict[int, int]) -> list[torch.Tensor]:
        """`_next_tokens` of every request of a group, the last chunks' appended tokens copied
        to the device together."""
        last = [i for i in range(len(group)) if ends[i] == seqs[i].shape[0]]
        tails = {}
        if last:
            tokens = [group[i].token_ids[-1] if group[i].token_ids else first.get(i) for i in last]
            tails = dict(zip(last, to_device(tokens, self.device).split(1)))
        return [torch.cat([seq[a + 1 :], tails[i]]) if i in tails else seq[a + 1 : e + 1]
                for i, (seq, a, e) in enumerate(zip(seqs, starts, ends))]

    def _prefill_chunk(self, request: RequestState) -> None:
        """One prefill chunk of target and drafter; the last one also makes the request running."""
        slot = request.slot
        seq = to_device(request.prefill_tokens, self.device)
        L, start = seq.shape[0], request.prefilled
        end = min(start + self.config.schedule.prefill_chunk_size, L)
        logits, hidden = self.runner.prefill(slot, seq[start:end], start)  # [V], [T, w]
        first = self._first_tokens([request], logits[None], [L])[0] if end == L and not request.token_ids else None
        self._finish_chunk(request, seq, start, end, hidden, first)

    def _first_tokens(self, requests: list[RequestState], logits: torch.Tensor, lengths: list[int]) -> list[int]:
        """The first generated token of each request whose prompt (of `lengths` tokens) just
        finished prefilling: drawn from `logits` [k, V] with the request's sampling and a
        uniform keyed by its seed and prompt length (the same alone or in a group). One host
        sync. All greedy: the argmax, which is what the draw from a greedy row's one-hot gives
        (`sampling_probs`: ties to the lowest index, as `torch.argmax`), without the sort,
        float64 cumsums and hashing of the vocabulary that cost ~1-6 ms a group on the H200
        (8B shape, V = 128256, batch 64)."""
        if all(r.params.temperature == 0 for r in requests):
            return logits.float().argmax(-1).tolist()
        sp = self.state.sampling
        index_at = to_device([[r.slot for r in requests], lengths], self.device)  # [2, k]
        index, at = index_at[0], index_at[1]
        probs = sampling_probs(logits, sp.temperature[index], sp.top_k[index], sp.top_p[index], sp.min_p[index])
        u = counter_uniforms(sp.seed[index], at, 1, STREAM_FIRST_TOKEN)  # [k, 1]
        return sample_from_probs(probs, u[:, 0]).tolist()

    def _finish_chunk(self, request: RequestState, seq: torch.Tensor, start: int, end: int, hidden,
                      first: int | None, *, drafted: bool = False) -> None:
        """After the target ran chunk [start, end) of `seq`: the drafter's chunk (unless
        `drafted`: done for the whole group); after the last chunk, the first token (`first`;
        a request re-admitted after a preemption already has it) and the request's step
        state, so it runs. A request that drafts nothing (budget 0: `num_draft_tokens=0`)
        skips the drafter: its slot stays as `reset_slot` left it, which drafts a root-only
        tree (the `Drafter` contract), and the draft head's prompt pass is not paid for it
        (0.044 s of a 1.53 s batch-64 run of the 8B shape on the H200, b2852cc)."""
        slot, L = request.slot, seq.shape[0]
        if not drafted and request.budget != 0:
            _drafter_prefill(self.strategies.drafter, slot, self._next_tokens(request, seq, start, end, first), hidden, start)
        if end < L:
            request.prefilled = end
            return
        resumed = bool(request.token_ids)  # re-admitted after a preemption: the root is known
        token = request.token_ids[-1] if resumed else first
        st = self.state  # `fill_`, not `x[slot] = v`: that copies v from a CPU tensor, a stream sync each on CUDA
        st.root_tokens[slot].fill_(token)
        st.committed_len[slot].fill_(L)
        st.accept_length[slot].fill_(-1)
        st.accept_tokens[slot].fill_(-1)
        st.draft_budget[slot].fill_(request.budget)
        st.active[slot].fill_(True)
        request.prefilled, request.committed, request.status = L, L, RUNNING
        self._last_accept[slot], self._last_tokens[slot], self._roots[slot] = -1, [], token
        self._path_len[slot] = -1
        if not resumed:
            self._emit(request, [token])

    def _set_sampling(self, slot: int, request: RequestState) -> None:
        """The slot's sampling row (`fill_`: a kernel argument each, no stream sync; seen on the
        H200 at 3659094, `x[slot] = v` synchronized once per field and request)."""
        params, sp = request.params, self.state.sampling
        sp.temperature[slot].fill_(float(params.temperature))
        sp.top_k[slot].fill_(int(params.top_k))
        sp.top_p[slot].fill_(float(params.top_p))
        sp.min_p[slot].fill_(float(params.min_p))
        sp.seed[slot].fill_(int(request.seed))


def use_prefill_buckets(runner, drafter, config: SpecConfig, *, capture: bool, pool=None) -> int:
    """Bucketed prefill for the target runner and the drafter (each that has
    `use_prefill_buckets` and none yet): chunks of up to min(prefill_chunk_size, max_seq_len)
    tokens, groups of up to max_batch_size when the runner groups prefills (`prefill_many`),
    rows x length within prefill_chunk_size. Returns the graphs captured."""
    max_len = min(config.schedule.prefill_chunk_size, config.cache.max_seq_len)
    grouped = hasattr(runner, "prefill_many")
    rows = config.cache.max_batch_size if grouped else 1
    captured = 0
    if hasattr(runner, "use_prefill_buckets") and runner.prefill_buckets is None:
        captured += runner.use_prefill_buckets(max_len, capture=capture, pool=pool, max_rows=rows)
    if hasattr(drafter, "use_prefill_buckets") and drafter.prefill_buckets is None:
        rows = rows if hasattr(drafter, "prefill_many") else 1
        captured += drafter.use_prefill_buckets(max_len, capture=capture, pool=pool, max_rows=rows,
                                                max_tokens=config.schedule.prefill_chunk_size)
    return captured



def _drafter_prefill(drafter, slot: int, next_tokens: torch.Tensor, hidden, start: int) -> None:
    # a drafter written before chunked prefill takes (slot, next_tokens, hidden): the first chunk
    if start:
        drafter.prefill(slot, next_tokens, hidden, start)
    else:
        drafter.prefill(slot, next_tokens, hidden)
