"""The engine: the iteration around the device step, for up to B concurrent requests.

The step itself is `DeviceStep` (`step.py`), one device function over the fixed-capacity
`StepState` (B = max_batch_size slots x N tree slots). `SpecEngine.run_iteration` does, on
the host, what must happen between steps (continuous batching):

- admission (`scheduler.py` decides who and where, `kv_blocks.py` backs the prompt);
- chunked, grouped prefill and first tokens (`prefill.py`);
- KV blocks reserved ahead of need, preemption on a short pool (`kv_blocks.py`);
- host drafters (n-gram): drafting between steps from the hand-off lists;
- the launch, on the smallest batch bucket that holds every live slot: a CUDA graph replay
  when graphs are on (captured by `warmup`, `graphs.py`), else the eager (optionally
  compiled) function; with `adaptive`, the speculative or a plain step (`adaptive.py`);
- the token hand-off: exactly one device-to-host copy per step (accepted lengths and tokens
  together, into pinned memory) and one wait on it (with `overlap`, after the next step is
  launched); then stops, EOS and `max_new_tokens` (`lifecycle.py`);
- failures: an exception in a request's prefill fails that request; one in a step fails
  the requests of that step; either way their slots, KV blocks and drafter state are
  released and every other request goes on.

It knows nothing about model internals: the target is a `TargetRunner` (`protocols.py`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..config import ConfigError, SpecConfig
from ..pipeline import derive_sizes
from ..registry import Strategies
from ..step_state import StepState, drafter_slot_state
from .adaptive import BARE, DEFERRED, PLAIN, SPECULATIVE, AdaptiveRule, plain_step_due
from .graphs import Graphs, WarmupReport
from .kv_blocks import KVBlocks
from .lifecycle import Lifecycle
from .prefill import Prefill
from .protocols import StepObserver, TargetRunner
from .request import RUNNING, WAITING, RequestState
from .scheduler import Scheduler, bucket_holding
from .step import DeviceStep
from .step_timing import PhaseTimer, StepTimes
from .watchdog import ProgressWatchdog

__all__ = ["SpecEngine", "TargetRunner", "RequestState", "StepObserver", "WarmupReport"]

KV_LEN_BUCKET = 128  # eager steps scan keys up to a multiple of this (few distinct shapes)


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
    prefill_clock: float  # the engine's `_prefill_clock` at its launch: prefill host time spent since then is not its own



class SpecEngine(Lifecycle, Prefill, KVBlocks, Graphs):
    """Runs speculative decoding steps for up to `config.cache.max_batch_size` concurrent requests.

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
        B = config.cache.max_batch_size
        self.sizes = sizes = derive_sizes(config, strategies)  # N, lookahead, budgets: derived once (`pipeline`)
        N = self.num_slots_tree = sizes.num_tree_slots
        caps = strategies.drafter_caps
        self.host_drafter = caps.runs_on_host
        self.lookahead = sizes.lookahead  # positions past committed_len a step writes: the target's tree, the drafter's rows
        self.buckets = sizes.batch_buckets
        # every per-slot tensor a step touches, the drafter's own (`slot_state`) included
        self.state = StepState.allocate(B, N, runner.hidden_width, device=self.device, hidden_dtype=runner.dtype,
                                        drafter=drafter_slot_state(strategies.drafter))
        self.device_step = DeviceStep(strategies, runner, self.state, compiled=compiled)
        # adaptive speculation: a plain step beside the speculative one, chosen per step by measured cost
        self.adaptive = bool(config.schedule.adaptive) and N > 1
        # a deferred plain step skips the drafter (its token joins the path the drafter ingests
        # next), as long as every path stays within the depth a head drafter ingests (D + 1 rows)
        depth = getattr(strategies.drafter, "depth", None)
        self.defer_depth = depth if self.adaptive and not caps.runs_on_host and isinstance(depth, int) else None
        self.steps = {SPECULATIVE: self.device_step}
        if self.adaptive:
            self.steps[PLAIN] = DeviceStep(strategies, runner, self.state, compiled=compiled, plain=True)
        if self.defer_depth is not None:
            self.steps[DEFERRED] = DeviceStep(strategies, runner, self.state, compiled=compiled, plain=True, defer=True)
            # every running request admitted without its drafter (`AdaptiveRule.admit_with_drafter`): the
            # target's step alone (the deferred one still captures states and extends the paths: at
            # b2852cc on the H200 its batch-64 step of the 8B shape cost 4.9% more than target-only's)
            self.steps[BARE] = DeviceStep(strategies, runner, self.state, compiled=compiled, plain=True, bare=True)
        caps = strategies.policy_caps  # None: strategies assembled by hand, without a tree policy
        self.chain = caps is None or caps.chain  # one draft per depth: any budget cuts it cleanly
        self.adaptive_rule = AdaptiveRule(sizes.adaptive_depth, self.chain, sizes.draft_budget) if self.adaptive else None
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
        self.overlap = config.schedule.overlap  # may be switched between steps (the step in flight is drained)
        self._inflight: _Inflight | None = None  # the launched step whose hand-off is not read yet
        self._last_handoff = 0.0  # host time the last hand-off was read
        # host seconds spent in prefill so far: an overlapped step whose hand-off is read after a
        # prefill ran in between (the device ran the step, then the prompts' forwards) is charged
        # without that prefill, and is no sample of its variant's cost for the adaptive rule (at
        # b2852cc on the H200 a batch-64 step measured 103 ms with the prefill of 32 prompts in it)
        self._prefill_clock = 0.0
        self.scheduler = Scheduler(B)  # the queue, the slots and who runs where
        self.touched: list[RequestState] = []  # requests with new tokens or a finish this iteration
        self._touched_ids: set[int] = set()  # their ids (a list membership test cost O(batch) per request)
        self._next_id = 0
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

    # ------------------------------------------------------------------ views
    @property
    def slots(self) -> list[RequestState | None]:
        """The request holding each slot (None = free)."""
        return self.scheduler.slots

    @property
    def waiting(self) -> deque[RequestState]:
        """Submitted requests not admitted yet, oldest first."""
        return self.scheduler.waiting

    @property
    def requests(self) -> list[RequestState | None]:
        """The request holding each slot (None = free); waiting requests hold none."""
        return self.scheduler.slots

    def free_slots(self) -> list[int]:
        return self.scheduler.free_slots()

    def running(self) -> list[RequestState]:
        return self.scheduler.running()

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or self._inflight is not None

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def run_iteration(self) -> list[RequestState]:
        """Admit, advance prefills, run one step; returns the requests that got tokens or finished."""
        self.touched = []
        self._touched_ids = set()
        self._admit()
        t_prefill = time.perf_counter()
        self._advance_prefills()
        self._prefill_clock += time.perf_counter() - t_prefill
        if self.scheduler.has_running() or self._inflight is not None:
            try:
                self.step()
            except Exception as err:  # the step's requests fail; everything else goes on
                self._inflight = None
                self._fail(self.running(), err)
        for request, why in self.watchdog.check(self.slots, self.waiting):  # never hang on a stuck request
            if request.status == WAITING:
                self.scheduler.dequeue(request)
            self._finish(request, "error", why)
        return self.touched

    def run_until_done(self, max_steps: int | None = None) -> None:
        steps = 0
        while self.has_work():
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"requests still running after max_steps={max_steps}")
            self.run_iteration()
            steps += 1

    # ------------------------------------------------------------------ admission
    def _admit(self) -> None:
        while self._admit_one():
            pass

    def _admit_one(self) -> bool:
        """The oldest waiting request takes the lowest free slot, if the pool can back its prompt."""
        request = self.scheduler.admit_next(self._back_prompt)
        if request is not None:
            if self.adaptive and request.budget and not self.adaptive_rule.admit_with_drafter(
                    request.budget, lambda: self._joining(request)):
                request.budget = 0  # a head that pays in no bucket: no draft prompt pass, nothing to keep current
            self._set_sampling(request.slot, request)
        return request is not None

    def _joining(self, request: RequestState) -> tuple[int, list[RequestState], int]:
        """(the batch bucket `request` joins, the other requests holding slots, how many waiting
        requests take the free slots after it now): admissions fill the lowest free slots."""
        slots = self.slots
        others = [r for r in slots if r is not None and r is not request]
        free = [i for i, r in enumerate(slots) if r is None]
        coming = min(len(self.waiting), len(free))
        last = max([r.slot for r in others] + [request.slot] + free[:coming])
        return bucket_holding(self.buckets, last), others, coming

    # ------------------------------------------------------------------ the step
    def _bucket(self) -> int:
        return self.scheduler.bucket(self.buckets)

    def _kv_len_bound(self, b: int) -> int:
        """Static key bound for an eager step: the live slots' reach, rounded up to a bucket."""
        reach = max([r.committed for r in self.running() if r.slot < b] + [0]) + self.lookahead
        if self._inflight is not None:  # the host's lengths lag the step in flight by up to N positions
            reach += self.lookahead
        return min(-(-reach // KV_LEN_BUCKET) * KV_LEN_BUCKET, self.config.cache.max_seq_len)

    def _stage_host_drafts(self, b: int) -> None:
        active = [r is not None and r.status == RUNNING for r in self.slots[:b]]
        tokens, parents, num_nodes = self.strategies.drafter.propose_host(
            self._last_accept[:b], self._last_tokens[:b], self._roots[:b], active
        )
        pin = self.device.type == "cuda"
        st = self.state
        for dst, src in ((st.draft_tokens, tokens), (st.draft_parents, parents), (st.draft_num_nodes, num_nodes)):
            dst[:b].copy_(src.pin_memory() if pin else src, non_blocking=pin)

    def _plain_due(self, running: list[RequestState]) -> str:
        """The plain step an adaptive step would run (`adaptive.plain_step_due`): BARE when no
        running request drafts, DEFERRED while every path stays within the drafter's depth, else
        PLAIN (the drafter ingests). A request that drafts nothing (budget 0) has no draft state
        to keep current; a path's length after a speculative step still in flight is unknown (None)."""
        path_len = self._path_len
        return plain_step_due(running, [path_len[r.slot] for r in running], self.defer_depth)

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
        if self.cuda_graphs and not self.warmed and self.scheduler.has_running():
            raise RuntimeError("CUDA graphs are on but not captured: call warmup() before admitting requests")
        if self._overlapping():
            pending = self._inflight  # still in flight while the next is reserved and launched
            self._inflight = self._begin(pending) if self.scheduler.has_running() else None
            if pending is not None:
                self._complete(pending)
            return
        if self._inflight is not None:  # overlap switched off, or a request is near its end: drain first
            pending, self._inflight = self._inflight, None
            self._complete(pending)
        if self.scheduler.has_running():
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
        self._reserve_ahead()  # (it may preempt: the running requests are read after it)
        b = self._bucket()
        running = self.running()  # all below b: the bucket holds every running slot
        variant = SPECULATIVE
        if self.adaptive:
            plain = self._plain_due(running)
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
        if self.adaptive:  # the paths a deferred step may extend (`plain_step_due`)
            if variant == DEFERRED:
                for r in running:  # None: a request that drafts nothing, its speculative step in flight
                    if self._path_len[r.slot] is not None:
                        self._path_len[r.slot] += 1
            elif variant == PLAIN:
                for r in running:
                    self._path_len[r.slot] = 0
            # BARE: every request of the step drafts nothing, and nothing reads such a request's path (`plain_step_due`)
            else:  # the accepted length, known at the hand-off
                for r in running:
                    self._path_len[r.slot] = None
            # the last step's acceptance, folded in while the device runs this one, and the expected tokens of
            # this step's requests summed for the next choice
            self.adaptive_rule.fold(running)
        decision = self.adaptive_rule.last if self.adaptive else None
        return _Inflight(b, variant, [(r.slot, r) for r in running], host, event, decision,
                         pending is not None, t0, t_launch, t_launched, time.perf_counter(), self._prefill_clock)

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
        # a speculative step's requests and accepted lengths; a plain step's requests
        observed, observed_lengths, idle = [], [], []
        slots, host_drafter, path_len = self.slots, self.host_drafter, self._path_len
        # a bare step's requests draft nothing: nothing to observe, age or track (~0.5 us a request on the host)
        tracked = self.adaptive and variant != BARE
        for slot, request in step.running:  # per request, only what this engine reads (~1.7 us each at batch 64)
            if request.status != RUNNING or slots[slot] is not request:
                continue  # finished (or left) while the step was in flight: its rows are dropped
            a = lengths[slot]
            emitted = rows[slot][1 : a + 2]
            request.committed += a + 1
            request.accepted_per_step.append(a)
            request.budget_per_step.append(request.budget if speculative else 0)
            emitted_total += a + 1
            if tracked:
                if speculative:
                    observed.append(request)
                    observed_lengths.append(a)
                else:
                    idle.append(request)
                if path_len[slot] is None and slot not in ran_later:  # a later step's launch set it otherwise
                    path_len[slot] = a
            if host_drafter:  # what the host drafter drafts from next
                self._last_accept[slot], self._last_tokens[slot], self._roots[slot] = a, emitted, emitted[-1]
            self._emit(request, emitted)
        t_end = time.perf_counter()
        # a step's seconds: from when the device could start it (its launch, or the end of the
        # step before it when that was later) to its hand-off, less the prefill the host ran in
        # between (only overlapped steps have any); without overlap, from the step's start
        prefilled = self._prefill_clock - step.prefill_clock  # host seconds of prefill since its launch
        if step.overlapped:
            self.last_step_seconds = max(0.0, t_handoff - max(step.t_launch, self._last_handoff) - prefilled)
        else:
            self.last_step_seconds = t_end - step.t0
        self.step_times.add(self.last_step_seconds, self._timer.read() if self.phase_timing else None, bucket=b,
                            variant=variant, tokens=emitted_total, running=len(step.running),
                            host=(step.t_launch - step.t0, step.t_launched - step.t_launch,
                                  step.t_folded - step.t_launched,
                                  # waiting: from the launch work's end (without overlap: the parts add up
                                  # to the step's seconds), or from this wait's start when overlapped
                                  t_handoff - (t_wait if step.overlapped else step.t_folded), t_end - t_handoff),
                            beside_prefill=prefilled > 0)
        self._last_handoff = t_handoff
        if self.adaptive:
            # the cost model takes the time at the next fold, beside the device (`AdaptiveRule.measured`)
            self.adaptive_rule.measured(b, variant, emitted_total, self.last_step_seconds, step.decision,
                                        sample=prefilled == 0, later=True)
            chosen_at = None if step.decision is None else step.decision.step  # None: no choice recorded (forced)
            self.adaptive_rule.observe_later(observed, observed_lengths, step=chosen_at, idle=idle)
        for obs in self.observers:
            obs.on_step(self, lengths)



@contextlib.contextmanager
def _sync_guard():
    """Raise on any CUDA host sync inside the block (`torch.cuda.set_sync_debug_mode`)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)

