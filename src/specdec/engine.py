"""The engine: host work around the device step (admission, prefill, KV blocks, hand-off).

The step itself is `specdec.step.DeviceStep`, one device function over the fixed-capacity
`StepState` (B = max_batch_size slots x N tree slots). The engine keeps only what must
happen on the host:

- admitting a request: validation, a free slot (the lowest, so live slots stay packed at
  the front and the batch bucket stays small), chunked prefill of its prompt
  (`config.prefill_chunk_size` tokens per forward), the first token;
- reserving KV blocks ahead of need (`config.kv_lookahead_steps` steps ahead, one
  asynchronous pinned copy of the block tables per step, never inside the device step);
- host drafters (n-gram): drafting between steps from the hand-off lists;
- launching the step on the smallest batch bucket that holds every live slot: a CUDA graph
  replay when graphs are on (captured by `warmup`), else the eager (optionally compiled)
  function;
- the token hand-off: exactly one device-to-host copy per step (accepted lengths and tokens
  together, into pinned memory) and one wait on it, after which stops, EOS and
  `max_new_tokens` are applied.

It knows nothing about model internals: the target is a `TargetRunner` (below).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .config import ConfigError, SamplingParams, SpecConfig
from .ops import sample_from_probs, sampling_probs
from .ops.random import STREAM_FIRST_TOKEN, counter_uniforms
from .registry import Strategies
from .step import DeviceStep, StepState
from .strategies import TargetInfo
from .types import TreeMeta

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
class RequestState:
    """Host-side record of one request."""

    slot: int
    prompt: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)  # draft tokens accepted each step
    finished: bool = False
    finish_reason: str | None = None  # "stop", "eos" or "length"
    committed: int = 0  # tokens with target KV (host copy of StepState.committed_len)
    max_positions: int = 0  # the most positions it can ever need (prompt + new + lookahead)


@dataclass
class WarmupReport:
    """What `SpecEngine.warmup` did: seconds spent, the batch buckets run, graphs captured."""

    seconds: float
    buckets: tuple[int, ...]
    graphs: int


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
        self.state = StepState.allocate(B, N, runner.hidden_width, device=self.device, hidden_dtype=runner.dtype)
        self.device_step = DeviceStep(strategies, runner, compiled=compiled)
        pin = self.device.type == "cuda"
        self._handoff_host = torch.zeros(B, N + 1, dtype=torch.int64, pin_memory=pin)  # [B, N + 1]
        self._handoff_event = torch.cuda.Event() if pin else None
        self.requests: list[RequestState | None] = [None] * B
        self.eos_token_ids = tuple(runner.info.eos_token_ids)
        # host copies the host drafter reads: last step's emitted tokens per slot
        self._last_accept = [-1] * B
        self._last_tokens: list[list[int]] = [[] for _ in range(B)]
        self._roots = [0] * B
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_count = 0
        self.warmed = False
        self.check_syncs = False  # CUDA: fail on any host sync inside the device part (tests)

    # ------------------------------------------------------------------ requests
    def free_slots(self) -> list[int]:
        return [s for s, r in enumerate(self.requests) if r is None]

    def has_work(self) -> bool:
        return any(r is not None for r in self.requests)

    def check_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise `ConfigError` if `prompt` / `params` cannot run; touches no state."""
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"sampling must be a SamplingParams, got {type(params).__name__}")
        if self.strategies.verifier_caps.greedy_only and not params.greedy:
            raise ConfigError(
                f"temperature={params.temperature} needs a sampling verifier; this verifier decodes greedily "
                "(use verifier='target-only' or 'speculative', or temperature=0)"
            )
        if len(prompt) == 0:
            raise ConfigError("prompt is empty; a request needs at least one token")
        vocab = self.runner.info.vocab_size
        bad = [t for t in prompt if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ConfigError(f"prompt token ids {bad[:5]} are out of range; allowed: [0, {vocab})")
        need = len(prompt) + params.max_new_tokens + self.lookahead
        if need > self.config.max_seq_len:
            raise ConfigError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={params.max_new_tokens} + "
                f"{self.lookahead} positions drafted ahead = {need} exceeds max_seq_len={self.config.max_seq_len}"
            )

    @torch.inference_mode()
    def add_request(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """Prefill `prompt` into the lowest free slot (in chunks) and sample its first token."""
        self.check_request(prompt, params)
        free = self.free_slots()
        if not free:
            raise ConfigError(f"all {self.config.max_batch_size} request slots are busy (max_batch_size)")
        slot = free[0]
        L = len(prompt)
        request = RequestState(slot=slot, prompt=list(prompt), params=params, committed=L,
                               max_positions=L + params.max_new_tokens + self.lookahead)
        self.runner.reserve(slot, min(L + self.lookahead * (1 + self.config.kv_lookahead_steps), request.max_positions))
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self.generator))
        self._set_sampling(slot, params, seed)
        first = self._prefill(slot, torch.tensor(prompt, dtype=torch.int64, device=self.device))
        st = self.state
        st.root_tokens[slot] = first[0]
        st.committed_len[slot] = L
        st.accept_length[slot] = -1
        st.accept_tokens[slot] = -1
        st.active[slot] = True
        self.requests[slot] = request
        token = int(first[0])  # host sync (prefill is not the hot loop)
        self._last_accept[slot], self._last_tokens[slot], self._roots[slot] = -1, [], token
        self._emit(request, [token])
        return request

    def _prefill(self, slot: int, prompt: torch.Tensor) -> torch.Tensor:
        """Chunked prefill of target and drafter; returns the first token [1] int64 (on device)."""
        L = prompt.shape[0]
        C = self.config.prefill_chunk_size
        drafter = self.strategies.drafter
        starts = list(range(0, L, C))
        for start in starts:
            end = min(start + C, L)
            logits, hidden = self.runner.prefill(slot, prompt[start:end], start)  # [V], [T, w]
            if end < L:  # the chunk's next tokens are all in the prompt
                _drafter_prefill(drafter, slot, prompt[start + 1 : end + 1], hidden, start)
        sp = self.state.sampling
        pick = slice(slot, slot + 1)
        probs = sampling_probs(logits[None], sp.temperature[pick], sp.top_k[pick], sp.top_p[pick], sp.min_p[pick])
        u = counter_uniforms(sp.seed[pick], torch.full((1,), L, dtype=torch.int64, device=self.device), 1, STREAM_FIRST_TOKEN)
        first = sample_from_probs(probs, u[:, 0])  # [1]
        start = starts[-1]
        _drafter_prefill(drafter, slot, torch.cat([prompt[start + 1 :], first]), hidden, start)
        return first

    def _set_sampling(self, slot: int, params: SamplingParams, seed: int) -> None:
        sp = self.state.sampling
        sp.temperature[slot] = float(params.temperature)
        sp.top_k[slot] = int(params.top_k)
        sp.top_p[slot] = float(params.top_p)
        sp.min_p[slot] = float(params.min_p)
        sp.seed[slot] = int(seed)

    # ------------------------------------------------------------------ warm-up
    def warmup(self, *, progress: bool = False) -> WarmupReport:
        """Run every batch bucket's step once (and a 1- and a 2-token prefill), so compiled
        pieces are compiled now, then capture one CUDA graph per bucket when graphs are on.

        Needs an idle engine (no live request): the runs see only idle slots, which write
        nothing that a request reads.
        """
        if self.has_work():
            raise RuntimeError("warmup() needs an idle engine; call it before admitting requests")
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._warm_prefill()
            buckets = sorted(self.buckets, reverse=True)  # largest first: smaller graphs reuse its pool
            bar = _progress(buckets, progress, "warmup")
            if self.cuda_graphs:
                pool = torch.cuda.graph_pool_handle()
                for b in bar:
                    self._capture(b, pool)
            else:
                for b in bar:
                    self.device_step(self.state.rows(b), self._kv_len_bound(b))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warmed = True
        return WarmupReport(time.perf_counter() - t0, tuple(sorted(self.buckets)), len(self.graphs))

    def _warm_prefill(self) -> None:
        """Prefill 2 tokens, then 1, into slot 0 and forget them (compiles the prefill shapes)."""
        drafter = self.strategies.drafter
        for n in (2, 1):
            self.runner.reserve(0, n + self.lookahead)
            tokens = torch.zeros(n, dtype=torch.int64, device=self.device)
            _, hidden = self.runner.prefill(0, tokens, 0)
            _drafter_prefill(drafter, 0, tokens, hidden, 0)
            drafter.reset_slot(0)
            self.runner.free(0)

    def _capture(self, b: int, pool) -> None:
        kv_len = self.config.max_seq_len
        rows = self.state.rows(b)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile, autotune, allocate outside the capture
                self.device_step(rows, kv_len)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.device_step(rows, kv_len)
        self.graphs[b] = graph
        self.capture_count += 1

    # ------------------------------------------------------------------ the step
    def _bucket(self) -> int:
        last = max(s for s, r in enumerate(self.requests) if r is not None)
        return next(b for b in sorted(self.buckets) if b > last)

    def _kv_len_bound(self, b: int) -> int:
        """Static key bound for an eager step: the live slots' reach, rounded up to a bucket."""
        reach = max([r.committed for r in self.requests[:b] if r is not None] + [0]) + self.lookahead
        return min(-(-reach // KV_LEN_BUCKET) * KV_LEN_BUCKET, self.config.max_seq_len)

    def _reserve_ahead(self, b: int) -> None:
        ahead = self.lookahead * (1 + self.config.kv_lookahead_steps)
        for slot, r in enumerate(self.requests[:b]):
            if r is not None and self.runner.capacity(slot) < min(r.committed + self.lookahead, r.max_positions):
                self.runner.reserve(slot, min(r.committed + ahead, r.max_positions), flush=False)
        self.runner.flush()

    def _stage_host_drafts(self, b: int) -> None:
        active = [r is not None for r in self.requests[:b]]
        tokens, parents, num_nodes = self.strategies.drafter.propose_host(
            self._last_accept[:b], self._last_tokens[:b], self._roots[:b], active
        )
        pin = self.device.type == "cuda"
        st = self.state
        for dst, src in ((st.draft_tokens, tokens), (st.draft_parents, parents), (st.draft_num_nodes, num_nodes)):
            dst[:b].copy_(src.pin_memory() if pin else src, non_blocking=pin)

    def _launch(self, b: int) -> None:
        """The device part of the step (no host sync inside)."""
        guard = _sync_guard() if self.check_syncs and self.device.type == "cuda" else contextlib.nullcontext()
        with guard:
            if self.cuda_graphs:
                self.graphs[b].replay()
            else:
                self.device_step(self.state.rows(b), self._kv_len_bound(b))

    @torch.inference_mode()
    def step(self) -> None:
        """One speculative step for every active slot, ending in the token hand-off."""
        if not self.has_work():
            return
        if self.cuda_graphs and not self.warmed:
            raise RuntimeError("CUDA graphs are on but not captured: call warmup() before admitting requests")
        b = self._bucket()
        self._reserve_ahead(b)
        if self.host_drafter:
            self._stage_host_drafts(b)
        self._launch(b)
        # Token hand-off: the one device-to-host copy and the one wait of the step.
        host = self._handoff_host[:b]
        if self._handoff_event is not None:
            host.copy_(self.state.handoff[:b], non_blocking=True)
            self._handoff_event.record()
            self._handoff_event.synchronize()
        else:
            host.copy_(self.state.handoff[:b])
        rows = host.tolist()
        lengths = [row[0] for row in rows]
        for slot, request in enumerate(self.requests[:b]):
            if request is None:
                continue
            a = lengths[slot]
            emitted = rows[slot][1 : a + 2]
            request.committed += a + 1
            request.accepted_per_step.append(a)
            self._last_accept[slot], self._last_tokens[slot], self._roots[slot] = a, emitted, emitted[-1]
            self._emit(request, emitted)
        for obs in self.observers:
            obs.on_step(self, lengths)

    # ------------------------------------------------------------------ host side
    def _emit(self, request: RequestState, new_tokens: list[int]) -> None:
        """Append tokens, cutting at EOS / stop tokens / max_new_tokens; free finished slots."""
        params = request.params
        stops = set(params.stop_token_ids)
        eos = set() if params.ignore_eos else set(self.eos_token_ids)
        for tok in new_tokens:
            request.token_ids.append(tok)
            if tok in stops:
                request.finish_reason = "stop"
            elif tok in eos:
                request.finish_reason = "eos"
            elif len(request.token_ids) >= params.max_new_tokens:
                request.finish_reason = "length"
            if request.finish_reason is not None:
                self._finish(request)
                return

    def _finish(self, request: RequestState) -> None:
        request.finished = True
        slot = request.slot
        self.requests[slot] = None
        self.state.active[slot] = False
        self.runner.free(slot)
        self.strategies.drafter.reset_slot(slot)

    def run_until_done(self, max_steps: int | None = None) -> None:
        steps = 0
        while self.has_work():
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"requests still running after max_steps={max_steps}")
            self.step()
            steps += 1


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
