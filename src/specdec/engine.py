"""The engine: host work around the device step (admission, prefill, KV blocks, hand-off).

The step itself is `specdec.step.DeviceStep`, one device function over the fixed-capacity
`StepState` (B = max_batch_size slots x N tree slots). The engine keeps only what must
happen on the host, one `run_iteration` at a time (continuous batching):

- admission: submitted requests wait in a queue (`submit`); between steps the oldest
  waiting ones take free slots (the lowest, so live slots stay packed at the front and the
  batch bucket stays small) when the KV pool can back their prompt;
- chunked, grouped prefill (`config.prefill_chunk_size` padded tokens per forward): the
  next chunks of several prefilling requests share one target forward (a GPU prefill costs
  mostly launches); while other requests are running, one forward per iteration, so a new
  prompt never stalls them for longer than one chunk; then the first tokens (drawn together).
  With graphs on, a prefill whose chunks all start at position 0 replays the CUDA graph of
  its padded (requests, length) bucket, target and draft head (`use_prefill_buckets`,
  `runtime.bucket_graphs`; captured by `warmup`);
- reserving KV blocks ahead of need (`config.kv_lookahead_steps` steps ahead, one
  asynchronous pinned copy of the block tables per step, never inside the device step);
- host drafters (n-gram): drafting between steps from the hand-off lists;
- launching the step on the smallest batch bucket that holds every live slot: a CUDA graph
  replay when graphs are on (captured by `warmup`), else the eager (optionally compiled)
  function;
- the token hand-off: exactly one device-to-host copy per step (accepted lengths and tokens
  together, into pinned memory) and one wait on it, after which stops, EOS and
  `max_new_tokens` are applied;
- failures: an exception in a request's prefill fails that request; one in a step fails
  the requests of that step; either way their slots, KV blocks and drafter state are
  released and every other request goes on. A KV pool that runs short is not a failure: the
  youngest running request is preempted (its KV dropped, recomputed when it is admitted
  again) and every request still ends with exactly its solo output.

It knows nothing about model internals: the target is a `TargetRunner` (below).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Protocol

import torch

from collections import deque

from .compile_scope import compile_private
from .config import ConfigError, SamplingParams, SpecConfig
from .ops import sample_from_probs, sampling_probs
from .ops.random import STREAM_FIRST_TOKEN, counter_uniforms
from .adaptive import DEFERRED, PLAIN, SPECULATIVE, AdaptiveRule
from .registry import Strategies
from .request import FINISHED, PREFILLING, RUNNING, WAITING, RequestState
from .runtime.bucket_graphs import capture_graph
from .runtime.host_copy import to_device
from .runtime.kv_cache import KVCacheError
from .step_timing import PhaseTimer, StepTimes
from .step import DeviceStep, StepState
from .step_state import drafter_slot_state
from .strategies import TargetInfo
from .types import TreeMeta
from .validation import check_request
from .watchdog import ProgressWatchdog

__all__ = ["SpecEngine", "TargetRunner", "RequestState", "StepObserver", "WarmupReport"]

KV_LEN_BUCKET = 128  # eager steps scan keys up to a multiple of this (few distinct shapes)


class TargetRunner(Protocol):
    """The target side of a step: forwards over a paged KV cache owned by the runner."""

    info: TargetInfo
    cache: object  # what `Strategies.relocate_kv` mutates and a drafter's KV may share
    hidden_width: int  # width of the drafter's target states (0 = none)
    dtype: torch.dtype  # of those states

    def prefill(self, slot: int, tokens: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run one prompt chunk `[T] int64` of `slot` at positions start..start+T-1.

        Returns (logits of the chunk's last token [V] float32, drafter states [T, width] or None).
        A runner may also offer `prefill_many(slots, chunks, starts)` (several slots' chunks
        in one forward; `ModelRunner.prefill_many`), which the engine then uses.
        """

    def verify(
        self, tokens: torch.Tensor, tree: TreeMeta, committed_len: torch.Tensor, num_nodes: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run every slot's tree (node i's KV at committed_len + i; slots with num_nodes 0 are idle).

        tokens [B, N] int64, committed_len [B] int64, num_nodes [B] int64; kv_len (python int)
        bounds committed_len + N for every active slot (the keys attention must scan).
        Returns (logits [B, N, V] float32, drafter states [B, N, width] or None).
        """

    def reserve(self, slot: int, num_tokens: int, *, flush: bool = True) -> None:
        """Back positions [0, num_tokens) of `slot` with KV blocks (host side; errors if impossible)."""

    def capacity(self, slot: int) -> int: ...

    def flush(self) -> None:
        """Make reservations visible to the device (asynchronously)."""

    def free(self, slot: int) -> None: ...


class StepObserver(Protocol):
    """Host-side per-step observer (metrics, tracing); runs after the step's hand-off."""

    def on_step(self, engine: "SpecEngine", accept_length: list[int]) -> None: ...


@dataclass
class _Inflight:
    """A launched step whose hand-off the host has not read yet."""

    b: int  # its batch bucket
    variant: str
    running: list[tuple[int, RequestState]]  # (slot, request) of every request it ran
    host: torch.Tensor  # [b, N + 1] the pinned host rows its hand-off is copied into
    event: object  # torch.cuda.Event recorded after that copy (None on the CPU, where the copy is done at once)
    decision: object  # the adaptive rule's `Decision` for it (its choice count: `decision.step`), or None
    overlapped: bool  # launched while the step before it was still in flight
    t0: float  # host times: its start, launch call, after the launch, after the fold
    t_launch: float
    t_launched: float
    t_folded: float


@dataclass
class WarmupReport:
    """What `SpecEngine.warmup` did: seconds spent, the batch buckets run, graphs captured."""

    seconds: float
    buckets: tuple[int, ...]
    graphs: int
    prefill_graphs: int = 0  # target and drafter prefill graphs, one per (requests, length) bucket


class SpecEngine:
    """Runs speculative decoding steps for up to `config.max_batch_size` concurrent requests.

    Args:
        config: capacities and the batch buckets.
        runner: the target side (`TargetRunner`).
        strategies: the resolved strategies.
        device: where the state lives (the target's device).
        generator: a CPU generator that draws the seeds of unseeded requests.
        observers: host-side per-step observers (more can be appended to `observers`).
        cuda_graphs: replay each bucket's step from a CUDA graph (captured by `warmup`).
        compiled: the step's own pieces (the verifier's draws) go through torch.compile.
        compile_step: the whole step function through torch.compile as one graph per (batch
            bucket, variant) (`SpecConfig(compile="step")`), instead of its pieces only.
    """

    def __init__(
        self,
        config: SpecConfig,
        runner: TargetRunner,
        strategies: Strategies,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        observers: tuple[StepObserver, ...] = (),
        cuda_graphs: bool = False,
        compiled: bool = False,
        compile_step: bool = False,
    ) -> None:
        self.config = config
        self.runner = runner
        self.strategies = strategies
        self.device = torch.device(device)
        self.observers = list(observers)
        if generator is not None and generator.device.type != "cpu":
            raise ValueError(f"the engine's generator draws request seeds on the host; got one on {generator.device}")
        self.generator = generator or torch.Generator().manual_seed(0)
        if cuda_graphs and self.device.type != "cuda":
            raise ConfigError(f"cuda_graphs=True needs a CUDA target; the target is on {self.device}")
        self.cuda_graphs = cuda_graphs
        self.compile_step = compile_step
        self._compiled_steps: dict[tuple[int, str], object] = {}  # (bucket, variant) -> whole-step graph
        B = config.max_batch_size
        N = strategies.drafter.num_tree_slots
        if N > config.num_tree_slots:
            raise ConfigError(f"drafter proposes {N} tree slots, more than config.num_tree_slots={config.num_tree_slots}")
        self.num_slots_tree = N
        caps = strategies.drafter_caps
        self.host_drafter = caps.runs_on_host
        # positions past committed_len a step writes: the target's tree, the drafter's rows
        self.lookahead = max(N, caps.kv_lookahead)
        self.buckets = config.batch_buckets
        # every per-slot tensor a step touches, the drafter's own (`slot_state`) included
        self.state = StepState.allocate(B, N, runner.hidden_width, device=self.device, hidden_dtype=runner.dtype,
                                        drafter=drafter_slot_state(strategies.drafter))
        self.device_step = DeviceStep(strategies, runner, self.state, compiled=compiled)
        # adaptive speculation: a plain step beside the speculative one, chosen per step by measured cost
        self.adaptive = bool(config.adaptive) and N > 1
        # a deferred plain step skips the drafter (its token joins the path the drafter ingests
        # next), as long as every path stays within the depth a head drafter ingests (D + 1 rows)
        depth = getattr(strategies.drafter, "depth", None)
        self.defer_depth = depth if self.adaptive and not caps.runs_on_host and isinstance(depth, int) else None
        self.steps = {SPECULATIVE: self.device_step}
        if self.adaptive:
            self.steps[PLAIN] = DeviceStep(strategies, runner, self.state, compiled=compiled, plain=True)
        if self.defer_depth is not None:
            self.steps[DEFERRED] = DeviceStep(strategies, runner, self.state, compiled=compiled, plain=True, defer=True)
        caps = strategies.policy_caps  # None: strategies assembled by hand, without a tree policy
        self.chain = caps is None or caps.chain  # one draft per depth: any budget cuts it cleanly
        self.adaptive_rule = AdaptiveRule(min(config.max_draft_len, N - 1), self.chain, N - 1) if self.adaptive else None
        pin = self.device.type == "cuda"
        # two host buffers and events for the hand-off, so an overlapped step's copy never lands
        # in the buffer the host still reads (`overlap`)
        self._handoff_hosts = [torch.zeros(B, N + 1, dtype=torch.int64, pin_memory=pin) for _ in range(2)]  # [B, N + 1]
        self._handoff_events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self._next_buffer = 0
        # Overlapped steps (`SpecConfig(overlap=True)`, notes/OVERLAP.md): launch step n + 1 before
        # reading step n's hand-off, so the host's work around a step runs while the device
        # computes the next. Opt-in; not with a host drafter (it drafts from step n's tokens).
        # Requests that finish at step n run once more in n + 1 (their rows are dropped).
        self.overlap = config.overlap  # may be switched between steps (the step in flight is drained)
        self._inflight: _Inflight | None = None  # the launched step whose hand-off is not read yet
        self._last_handoff = 0.0  # host time the last hand-off was read
        self.slots: list[RequestState | None] = [None] * B  # the request holding each slot
        self.waiting: deque[RequestState] = deque()  # submitted, not admitted (oldest first)
        self.touched: list[RequestState] = []  # requests with new tokens or a finish this iteration
        self._touched_ids: set[int] = set()  # their ids (a list membership test cost O(batch) per request)
        self._next_id = 0
        self._admissions = 0
        self.eos_token_ids = tuple(runner.info.eos_token_ids)
        self.pool_positions = getattr(runner, "pool_positions", None)  # None = unbounded (test runners)
        self.model_context = getattr(runner, "model_context", None)  # the model's max_position_embeddings
        self.last_step_seconds = 0.0
        self.step_times = StepTimes()  # every step's time; split by phase while `phase_timing` is on
        self.phase_timing = False  # split steps into draft / verify / rest (runs them eagerly)
        self._timer = PhaseTimer(self.device)
        # host copies the host drafter reads: last step's emitted tokens per slot
        self._last_accept = [-1] * B
        self._path_len = [-1] * B  # accept_length on the device: rows of the path the drafter has not ingested, - 1
        self._last_tokens: list[list[int]] = [[] for _ in range(B)]
        self._roots = [0] * B
        self._backed = [0] * B  # target KV positions known to be backed per slot (`_reserve_ahead`)
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}  # (bucket, step variant) -> graph
        self.capture_count = 0  # step graphs captured
        self.prefill_graph_count = 0  # prefill graphs captured (target and drafter, per (requests, length) bucket)
        self.watchdog = ProgressWatchdog(config)  # a request that stops progressing fails, by name
        self.warmed = False
        self.check_syncs = False  # CUDA: fail on any host sync inside the device part (tests)

    # ------------------------------------------------------------------ requests
    @property
    def requests(self) -> list[RequestState | None]:
        """The request holding each slot (None = free); waiting requests hold none."""
        return self.slots

    def free_slots(self) -> list[int]:
        return [s for s, r in enumerate(self.slots) if r is None]

    def running(self) -> list[RequestState]:
        return [r for r in self.slots if r is not None and r.status == RUNNING]

    def has_work(self) -> bool:
        return bool(self.waiting) or any(r is not None for r in self.slots) or self._inflight is not None

    def check_request(self, prompt: list[int], params: SamplingParams, index: int | None = None) -> None:
        """Raise `ConfigError` if `prompt` / `params` cannot run (`validation.check_request`, plus
        the KV pool and draft-budget rules of this engine); touches no state."""
        check_request(
            prompt, params, vocab_size=self.runner.info.vocab_size, max_seq_len=self.config.max_seq_len,
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
        if (budget not in (None, 0) and budget < self.num_slots_tree - 1 and self.strategies.drafter_caps.samples_drafts
                and not self.chain):
            raise ConfigError(
                where + f"num_draft_tokens={budget}: a sampled draft tree keeps whole sibling groups, so with "
                f"verifier={self.config.verifier!r} and tree={self.config.tree!r} a request drafts all "
                f"{self.num_slots_tree - 1} tokens or none (num_draft_tokens None or 0)"
            )

    def submit(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """Queue a request (checked first); it is admitted between steps when a slot and KV are free."""
        self.check_request(prompt, params)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self.generator))
        full = self.num_slots_tree - 1
        budget = full if params.num_draft_tokens is None else min(params.num_draft_tokens, full)
        request = RequestState(
            id=self._next_id, prompt=list(prompt), params=params, seed=seed, budget=budget,
            max_positions=len(prompt) + params.max_new_tokens + self.lookahead,
        )
        self._next_id += 1
        self.waiting.append(request)
        return request

    @torch.inference_mode()
    def add_request(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """Submit and admit now: prefill `prompt` into the lowest free slot and sample its first token."""
        self.check_request(prompt, params)
        if not self.free_slots():
            raise ConfigError(f"all {self.config.max_batch_size} request slots are busy (max_batch_size)")
        request = self.submit(prompt, params)
        self.waiting.remove(request)
        self.waiting.appendleft(request)
        if not self._admit_one():
            self.waiting.remove(request)
            raise KVCacheError(f"the KV pool cannot back a prompt of {len(prompt)} tokens now; free finished requests")
        while request.status == PREFILLING:
            self._prefill_step(request)
        return request

    def abort(self, request: RequestState) -> None:
        """Stop a request now (finish reason "aborted"), releasing its slot, blocks and drafter state."""
        if request.status == FINISHED:
            return
        if request.status == WAITING:
            self.waiting.remove(request)
        self._finish(request, "aborted")

    def abort_all(self, reason: str = "aborted", error: str | None = None) -> None:
        """End every unfinished request (an interrupt, a failed step): nothing stays held."""
        for request in list(self.waiting) + [r for r in self.slots if r is not None]:
            if request.status == WAITING:
                self.waiting.remove(request)
            self._finish(request, reason, error)

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def run_iteration(self) -> list[RequestState]:
        """Admit, advance prefills, run one step; returns the requests that got tokens or finished."""
        self.touched = []
        self._touched_ids = set()
        self._admit()
        self._advance_prefills()
        if self.running() or self._inflight is not None:
            try:
                self.step()
            except Exception as err:  # the step's requests fail; everything else goes on
                self._inflight = None
                self._fail(self.running(), err)
        for request, why in self.watchdog.check(self.slots, self.waiting):  # never hang on a stuck request
            if request.status == WAITING:
                self.waiting.remove(request)
            self._finish(request, "error", why)
        return self.touched

    def run_until_done(self, max_steps: int | None = None) -> None:
        steps = 0
        while self.has_work():
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"requests still running after max_steps={max_steps}")
            self.run_iteration()
            steps += 1

    # ------------------------------------------------------------------ admission and prefill
    def _admit(self) -> None:
        while self.waiting and self.free_slots() and self._admit_one():
            pass

    def _admit_one(self) -> bool:
        """The oldest waiting request takes the lowest free slot, if the pool can back its prompt."""
        request, slot = self.waiting[0], self.free_slots()[0]
        L = len(request.prefill_tokens)
        ahead = self.lookahead * (1 + self.config.kv_lookahead_steps)
        try:
            self.runner.reserve(slot, min(L + ahead, request.max_positions))
        except KVCacheError:
            try:  # at least what the prompt and its first step need
                self.runner.reserve(slot, min(L + self.lookahead, request.max_positions))
            except KVCacheError:
                self.runner.free(slot)
                return False  # waits until finished requests give blocks back
        self.waiting.popleft()
        request.slot, request.status, request.prefilled = slot, PREFILLING, 0
        request.admitted, self._admissions = self._admissions, self._admissions + 1
        self.slots[slot] = request
        self._set_sampling(slot, request)
        return True

    def _advance_prefills(self) -> None:
        """Prefill chunks, oldest request first, `prefill_chunk_size` padded prompt tokens per
        forward: several prompts share one forward (`_prefill_group`), a long one takes one
        chunk of it. While at least as many requests run as wait for their prefill, one
        forward per iteration (the running ones wait at most one chunk's worth); while fewer
        run, forwards follow each other until as many run as wait. Why: a step costs what its
        batch bucket costs however few of its slots run, so when a wave of requests finishes
        together (or a batch starts), refilling one group per step ran the next ~B/3 steps
        at a fraction of their width; a speculative decoder, which finishes requests in fewer
        steps, spent most of its steps that way (SmolLM2 on the H200, batch 64: ~31 of 64
        slots running per bucket-64 step of the EAGLE-3 chain, ~53 for target-only)."""
        prefilling = self._prefilling()
        while prefilling:
            group = self._prefill_group(prefilling)
            if len(group) > 1:
                self._prefill_together(group)
            else:
                self._prefill_step(group[0])
            prefilling = self._prefilling()
            running = len(self.running())
            if running and running >= len(prefilling):
                return

    def _prefilling(self) -> list[RequestState]:
        """Requests admitted but not yet running, oldest first."""
        return sorted((r for r in self.slots if r is not None and r.status == PREFILLING), key=lambda r: r.admitted)

    def _prefill_group(self, prefilling: list[RequestState]) -> list[RequestState]:
        """Prefilling requests, oldest first, whose next chunks, padded to the longest, fit one
        forward of `prefill_chunk_size` tokens: always the oldest, then each younger one that
        still fits (one that does not waits, oldest, for the next forward); only the oldest
        if the runner has no `prefill_many`. When the runner prefills fresh prompts through
        padded (rows, length) buckets (`use_prefill_buckets`: one CUDA graph each), a group of
        them must also fit one bucket, or its forward runs eagerly (three 150-token prompts
        fit 512 tokens, their bucket 4 x 256 does not)."""
        budget = self.config.prefill_chunk_size
        if not hasattr(self.runner, "prefill_many"):
            return prefilling[:1]
        buckets = getattr(self.runner, "prefill_buckets", None)
        group, width = [], 0
        for request in prefilling:
            chunk = min(budget, len(request.prefill_tokens) - request.prefilled)
            rows, longest = len(group) + 1, max(width, chunk)
            if group and (rows * longest > budget or not _keeps_a_bucket(buckets, group, request, rows, longest)):
                continue
            group.append(request)
            width = longest
        return group

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
        size = self.config.prefill_chunk_size
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
        if hidden is not None and hasattr(self.strategies.drafter, "prefill_many"):
            try:
                nexts = self._next_tokens_many(group, seqs, starts, ends, first)
                self.strategies.drafter.prefill_many([r.slot for r in group], nexts, hidden, starts)
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
        end = min(start + self.config.prefill_chunk_size, L)
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
        state, so it runs."""
        slot, L = request.slot, seq.shape[0]
        if not drafted:
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

    # ------------------------------------------------------------------ warm-up
    def _variants(self) -> tuple[str, ...]:
        """The steps this engine runs: speculative, and when adaptive the plain ones."""
        return tuple(self.steps)

    def _step_fn(self, variant: str) -> DeviceStep:
        return self.steps[variant]

    def _run_step(self, b: int, variant: str, kv_len: int | None = None, timer: PhaseTimer | None = None) -> None:
        """Run `variant` on bucket `b` now (eager pieces, or the whole step compiled); kv_len:
        the static key bound, None = the live slots' reach (`_kv_len_bound`); timer: mark the
        phase boundaries (runs the step eagerly)."""
        step = self._step_fn(variant)
        if not self.compile_step or timer is not None:  # phase timing needs the boundaries
            step(self.state.rows(b), self._kv_len_bound(b) if kv_len is None else kv_len, timer)
            return
        fn = self._compiled_steps.get((b, variant))
        if fn is None:  # a private graph per (bucket, variant): no shared recompile budget
            fn = self._compiled_steps[(b, variant)] = compile_private(DeviceStep.__call__, fullgraph=True, dynamic=False)
        # a static key bound: one graph per bucket, whatever the contexts (the attention reads
        # each row's real key count on the device, so the bound costs little)
        # under no_grad, not inference mode: AOT autograd cannot functionalize in-place updates
        # traced under inference mode ("Cannot set version_counter for inference tensor")
        with torch.inference_mode(False), torch.no_grad():
            fn(step, self.state.rows(b), self.config.max_seq_len)

    def warmup(self, *, progress: bool = False) -> WarmupReport:
        """Run every batch bucket's step once (and a 1- and a 2-token prefill), so compiled
        pieces are compiled now, then capture one CUDA graph per bucket (and per step variant
        when adaptive) when graphs are on; with `adaptive`, time each variant per bucket (the
        cost model).

        Needs an idle engine (no live request): the runs see only idle slots, which write
        nothing that a request reads.
        """
        if self.has_work():
            raise RuntimeError("warmup() needs an idle engine; call it before admitting requests")
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._warm_prefill()
            if self.cuda_graphs:
                self._capture_prefills()
            buckets = sorted(self.buckets, reverse=True)  # largest first: smaller graphs reuse its pool
            jobs = [(b, v) for b in buckets for v in self._variants()]
            bar = _progress(jobs, progress, "warmup")
            pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
            for b, variant in bar:
                if self.cuda_graphs:
                    self._capture(b, variant, pool)
                else:
                    self._run_step(b, variant)
            if self.adaptive:
                for b, variant in jobs:
                    self.adaptive_rule.costs.record(b, variant, self._time_step(b, variant))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warmed = True
        return WarmupReport(time.perf_counter() - t0, tuple(sorted(self.buckets)), len(self.graphs),
                            self.prefill_graph_count)

    def _time_step(self, b: int, variant: str, repeats: int = 5) -> list[float]:
        """Seconds of one step of bucket `b` (idle slots: the shapes, hence the cost, of a full bucket)."""
        samples = []
        for _ in range(repeats):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            if self.cuda_graphs:
                self.graphs[(b, variant)].replay()
            else:
                self._run_step(b, variant)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            samples.append(time.perf_counter() - t0)
        return samples

    def _warm_prefill(self) -> None:
        """Prefill 2 tokens, then 1, into slot 0, and a group of two chunks into slots 0 and 1,
        and forget them (compiles the prefill shapes)."""
        drafter = self.strategies.drafter
        for n in (2, 1):
            self.runner.reserve(0, n + self.lookahead)
            tokens = torch.zeros(n, dtype=torch.int64, device=self.device)
            _, hidden = self.runner.prefill(0, tokens, 0)
            _drafter_prefill(drafter, 0, tokens, hidden, 0)
            drafter.reset_slot(0)
            self.runner.free(0)
        if hasattr(self.runner, "prefill_many") and self.config.max_batch_size >= 2:  # a grouped prefill too
            for slot in (0, 1):
                self.runner.reserve(slot, 2 + self.lookahead)
            chunks = [torch.zeros(n, dtype=torch.int64, device=self.device) for n in (2, 1)]
            _, hidden = self.runner.prefill_many([0, 1], chunks, [0, 0])
            if hidden is not None and hasattr(drafter, "prefill_many"):
                drafter.prefill_many([0, 1], chunks, hidden, [0, 0])
            for slot in (0, 1):
                drafter.reset_slot(slot)
                self.runner.free(slot)

    def _capture_prefills(self) -> None:
        """One CUDA graph per (requests, length) bucket for the target's and the drafter's
        prefill of chunks from position 0 (`use_prefill_buckets`; a part without it stays
        eager), in a pool of their own. At batch 1 the eager prefill cost more host time than the steps of
        a short answer."""
        self.prefill_graph_count += use_prefill_buckets(self.runner, self.strategies.drafter, self.config,
                                                        capture=True, pool=torch.cuda.graph_pool_handle())

    def _capture(self, b: int, variant: str, pool) -> None:
        kv_len = self.config.max_seq_len
        self.graphs[(b, variant)], _ = capture_graph(lambda: self._run_step(b, variant, kv_len), self.device, pool)
        self.capture_count += 1

    # ------------------------------------------------------------------ the step
    def _bucket(self) -> int:
        last = max(r.slot for r in self.running())
        return next(b for b in sorted(self.buckets) if b > last)

    def _kv_len_bound(self, b: int) -> int:
        """Static key bound for an eager step: the live slots' reach, rounded up to a bucket."""
        reach = max([r.committed for r in self.running() if r.slot < b] + [0]) + self.lookahead
        if self._inflight is not None:  # the host's lengths lag the step in flight by up to N positions
            reach += self.lookahead
        return min(-(-reach // KV_LEN_BUCKET) * KV_LEN_BUCKET, self.config.max_seq_len)

    def _reserve_ahead(self) -> None:
        """Back every running request's next steps; on a short pool, preempt the youngest.
        Most steps need no new block: `_backed[slot]` (the positions known to be backed, a
        lower bound, since a slot keeps its blocks until its request leaves) skips the
        allocator for them (batch 64, nothing to grow: 14 us a step against 34 asking it for
        every request, 2-core CPU)."""
        ahead = self.lookahead * (1 + self.config.kv_lookahead_steps)
        reach = self.lookahead * (2 if self._inflight is not None else 1)  # a step in flight advances up to N
        needs = ((r, min(r.committed + reach, r.max_positions)) for r in self.running())
        short = [(r, need) for r, need in needs if self._backed[r.slot] < need]
        for r, need in sorted(short, key=lambda pair: pair[0].admitted):  # the oldest are served first
            if r.status != RUNNING:
                continue  # preempted for an older request in this loop
            if self.runner.capacity(r.slot) < need:
                self._grow(r, need, ahead)
            self._backed[r.slot] = self.runner.capacity(r.slot)
        self.runner.flush()

    def _grow(self, r: RequestState, need: int, ahead: int) -> None:
        """Back `need` positions of `r` (`ahead` if the pool allows), preempting the youngest
        other requests while the pool is short."""
        for target in (min(r.committed + ahead, r.max_positions), need):
            try:
                self.runner.reserve(r.slot, target, flush=False)
                return
            except KVCacheError:
                continue
        while self.runner.capacity(r.slot) < need:
            victims = [v for v in self.running() if v is not r]
            if not victims:  # cannot happen: submit() refuses requests larger than the pool
                raise KVCacheError(f"request {r.id} cannot grow to {need} positions with the pool empty")
            self._preempt(max(victims, key=lambda v: v.admitted))
            try:
                self.runner.reserve(r.slot, need, flush=False)
            except KVCacheError:
                pass

    def _preempt(self, request: RequestState) -> None:
        """Drop `request`'s KV and slot; it waits at the front of the queue and resumes later."""
        self._release(request)
        request.slot, request.status, request.preemptions = None, WAITING, request.preemptions + 1
        self.waiting.appendleft(request)

    def _stage_host_drafts(self, b: int) -> None:
        active = [r is not None and r.status == RUNNING for r in self.slots[:b]]
        tokens, parents, num_nodes = self.strategies.drafter.propose_host(
            self._last_accept[:b], self._last_tokens[:b], self._roots[:b], active
        )
        pin = self.device.type == "cuda"
        st = self.state
        for dst, src in ((st.draft_tokens, tokens), (st.draft_parents, parents), (st.draft_num_nodes, num_nodes)):
            dst[:b].copy_(src.pin_memory() if pin else src, non_blocking=pin)

    def _can_defer(self, running: list[RequestState]) -> bool:
        """Whether a deferred plain step keeps every running path within the drafter's depth
        (a path's length after a speculative step still in flight is unknown: not then)."""
        if self.defer_depth is None:
            return False
        return all(self._path_len[r.slot] is not None and self._path_len[r.slot] + 1 <= self.defer_depth
                   for r in running)

    def _launch(self, b: int, variant: str = SPECULATIVE) -> None:
        """The device part of the step (no host sync inside)."""
        guard = _sync_guard() if self.check_syncs and self.device.type == "cuda" else contextlib.nullcontext()
        with guard:
            if self.cuda_graphs and not self.phase_timing:
                self.graphs[(b, variant)].replay()
            else:
                self._run_step(b, variant, timer=self._timer if self.phase_timing else None)

    @torch.inference_mode()
    def step(self) -> None:
        """One speculative step for every running request, ending in the token hand-off. With
        `overlap`, the next step is launched first and the previous one's hand-off is read
        after it: a call emits the tokens of the step launched by the call before."""
        if self.cuda_graphs and not self.warmed and self.running():
            raise RuntimeError("CUDA graphs are on but not captured: call warmup() before admitting requests")
        if self._overlapping():
            pending = self._inflight  # still in flight while the next is reserved and launched
            self._inflight = self._begin(pending) if self.running() else None
            if pending is not None:
                self._complete(pending)
            return
        if self._inflight is not None:  # overlap switched off, or a request is near its end: drain first
            pending, self._inflight = self._inflight, None
            self._complete(pending)
        if self.running():
            self._complete(self._begin(None))

    def _overlapping(self) -> bool:
        """Whether this step may launch before the previous hand-off is read: `overlap` on, no
        host drafter, and no running request within one step's tokens (N) of its
        max_new_tokens (the step in flight could end it, and the overlapped one would then
        run past the positions it backs)."""
        if not self.overlap or self.host_drafter:
            return False
        n = self.lookahead
        return all(r.params.max_new_tokens - len(r.token_ids) > n for r in self.running())

    def _begin(self, pending: "_Inflight | None") -> "_Inflight":
        """Reserve, choose and launch the device step for the running requests (no host sync),
        and queue its hand-off copy; `pending`: the step still in flight, if any."""
        t0 = time.perf_counter()
        self._reserve_ahead()
        b = self._bucket()
        running = [r for r in self.running() if r.slot < b]
        variant = SPECULATIVE
        if self.adaptive:
            plain = DEFERRED if self._can_defer(running) else PLAIN
            variant = SPECULATIVE if self.adaptive_rule.choose(b, running, plain) else plain
        if self.host_drafter:
            self._stage_host_drafts(b)
        t_launch = time.perf_counter()
        self._launch(b, variant)
        t_launched = time.perf_counter()
        i = self._next_buffer
        self._next_buffer = 1 - i
        host, event = self._handoff_hosts[i][:b], self._handoff_events[i]
        # the one device-to-host copy of the step, queued behind it (on the CPU the step has run)
        host.copy_(self.state.handoff[:b], non_blocking=event is not None)
        if event is not None:
            event.record()
        if variant == DEFERRED:
            for r in running:
                self._path_len[r.slot] += 1
        elif variant == PLAIN:
            for r in running:
                self._path_len[r.slot] = 0
        else:  # the accepted length, known at the hand-off
            for r in running:
                self._path_len[r.slot] = None
        if self.adaptive:  # the last step's acceptance, folded in while the device runs this one
            self.adaptive_rule.fold()
        decision = self.adaptive_rule.last if self.adaptive else None
        return _Inflight(b, variant, [(r.slot, r) for r in running], host, event, decision,
                         pending is not None, t0, t_launch, t_launched, time.perf_counter())

    def _complete(self, step: "_Inflight") -> None:
        """Wait for `step`'s hand-off (the one host sync) and hand its tokens to the requests
        that ran in it and still hold their slots."""
        # Token hand-off: the one device-to-host copy and the one wait of the step.
        b, variant, host = step.b, step.variant, step.host
        t_wait = time.perf_counter()
        if step.event is not None:
            step.event.synchronize()
        rows = host.tolist()
        later = self._inflight if self._inflight is not step else None  # a step launched after this one
        ran_later = set() if later is None else {slot for slot, _ in later.running}
        t_handoff = time.perf_counter()
        speculative = variant == SPECULATIVE
        lengths = [row[0] for row in rows]
        emitted_total = 0  # tokens the step produced (before EOS / length cuts)
        observed, observed_lengths = [], []  # the speculative step's requests and accepted lengths
        for slot, request in step.running:
            if request.status != RUNNING or self.slots[slot] is not request:
                continue  # finished (or left) while the step was in flight: its rows are dropped
            a = lengths[slot]
            emitted = rows[slot][1 : a + 2]
            request.committed += a + 1
            request.accepted_per_step.append(a)
            request.budget_per_step.append(request.budget if speculative else 0)
            emitted_total += len(emitted)
            if self.adaptive and speculative:
                observed.append(request)
                observed_lengths.append(a)
            self._last_accept[slot], self._last_tokens[slot], self._roots[slot] = a, emitted, emitted[-1]
            if self._path_len[slot] is None and slot not in ran_later:  # a later step's launch set it otherwise
                self._path_len[slot] = a
            self._emit(request, emitted)
        t_end = time.perf_counter()
        # a step's seconds: from when the device could start it (its launch, or the end of the
        # step before it when that was later) to its hand-off; without overlap, from the step's start
        if step.overlapped:
            self.last_step_seconds = t_handoff - max(step.t_launch, self._last_handoff)
        else:
            self.last_step_seconds = t_end - step.t0
        self.step_times.add(self.last_step_seconds, self._timer.read() if self.phase_timing else None, bucket=b,
                            variant=variant, tokens=emitted_total,
                            host=(step.t_launch - step.t0, step.t_launched - step.t_launch,
                                  step.t_folded - step.t_launched,
                                  # waiting: from the launch work's end (without overlap: the parts add up
                                  # to the step's seconds), or from this wait's start when overlapped
                                  t_handoff - (t_wait if step.overlapped else step.t_folded), t_end - t_handoff))
        self._last_handoff = t_handoff
        if self.adaptive:
            self.adaptive_rule.measured(b, variant, emitted_total, self.last_step_seconds, step.decision)
            chosen_at = None if step.decision is None else step.decision.step  # None: no choice recorded (forced)
            self.adaptive_rule.observe_later(observed, observed_lengths, step=chosen_at)
        for obs in self.observers:
            obs.on_step(self, lengths)

    # ------------------------------------------------------------------ host side
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
        if slot is None or self.slots[slot] is not request:
            return
        self.slots[slot] = None  # `request.slot` keeps the number (finished requests report it)
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


def use_prefill_buckets(runner, drafter, config: SpecConfig, *, capture: bool, pool=None) -> int:
    """Bucketed prefill for the target runner and the drafter (each that has
    `use_prefill_buckets` and none yet): chunks of up to min(prefill_chunk_size, max_seq_len)
    tokens, groups of up to max_batch_size when the runner groups prefills (`prefill_many`),
    rows x length within prefill_chunk_size. Returns the graphs captured."""
    max_len = min(config.prefill_chunk_size, config.max_seq_len)
    grouped = hasattr(runner, "prefill_many")
    rows = config.max_batch_size if grouped else 1
    captured = 0
    if hasattr(runner, "use_prefill_buckets") and runner.prefill_buckets is None:
        captured += runner.use_prefill_buckets(max_len, capture=capture, pool=pool, max_rows=rows)
    if hasattr(drafter, "use_prefill_buckets") and drafter.prefill_buckets is None:
        rows = rows if hasattr(drafter, "prefill_many") else 1
        captured += drafter.use_prefill_buckets(max_len, capture=capture, pool=pool, max_rows=rows,
                                                max_tokens=config.prefill_chunk_size)
    return captured


def _keeps_a_bucket(buckets, group: list[RequestState], request: RequestState, rows: int, longest: int) -> bool:
    """Whether `request` may join `group` (making it `rows` chunks of at most `longest` tokens)
    without losing its bucket: always without buckets, or when the group already runs eagerly
    (a chunk past position 0); else the request's chunk starts at 0 too and a bucket holds them."""
    if buckets is None or any(r.prefilled for r in group):
        return True
    return request.prefilled == 0 and buckets.bucket(rows, longest) is not None


def _drafter_prefill(drafter, slot: int, next_tokens: torch.Tensor, hidden, start: int) -> None:
    # a drafter written before chunked prefill takes (slot, next_tokens, hidden): the first chunk
    if start:
        drafter.prefill(slot, next_tokens, hidden, start)
    else:
        drafter.prefill(slot, next_tokens, hidden)


@contextlib.contextmanager
def _sync_guard():
    """Raise on any CUDA host sync inside the block (`torch.cuda.set_sync_debug_mode`)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _progress(items, show: bool, desc: str):
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="bucket")
