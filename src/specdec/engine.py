"""The step loop: capture -> draft -> build tree -> verify -> relocate KV, then hand off tokens.

The engine owns per-slot decoding state as fixed-capacity tensors (B = max_batch_size slots,
N = the drafter's tree slots) and runs the strategies that `specdec.registry.resolve`
returned; it never asks a strategy for its name, only for capabilities. The device part of a
step has no `.item()` and no branching on tensor values; the one host sync per step is the
token hand-off at its end, where stop tokens, EOS and `max_new_tokens` are applied.

It knows nothing about model internals: the target is a `TargetRunner` (see below) that
runs prefill and tree-verify forwards over its own paged KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .config import ConfigError, SamplingParams, SpecConfig
from .ops import sample_from_probs, sampling_probs
from .registry import Strategies
from .strategies import DraftInput, TargetInfo
from .types import SamplingTensors, TreeMeta

__all__ = ["SpecEngine", "TargetRunner", "RequestState", "StepObserver"]

KV_LEN_BUCKET = 128  # attention scans keys up to a multiple of this (static shapes per bucket)


class TargetRunner(Protocol):
    """The target side of a step: forwards over a paged KV cache owned by the runner."""

    info: TargetInfo
    cache: object  # what `Strategies.relocate_kv` mutates

    def prefill(self, slot: int, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the prompt `[L] int64` of `slot` (KV at positions 0..L-1).

        Returns (logits of the last prompt token [V] float32, captured states [L, d*n_capture] or None).
        """

    def verify(
        self, tokens: torch.Tensor, tree: TreeMeta, committed_len: torch.Tensor, num_nodes: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run every slot's tree (node i's KV at committed_len + i; slots with num_nodes 0 are idle).

        tokens [B, N] int64, committed_len [B] int64, num_nodes [B] int64; kv_len (python int)
        bounds committed_len + N for every active slot (the keys attention must scan).
        Returns (logits [B, N, V] float32, captured states [B, N, d*n_capture] or None).
        """

    def reserve(self, slot: int, num_tokens: int) -> None:
        """Back positions [0, num_tokens) of `slot` with KV blocks (host side; errors if impossible)."""

    def free(self, slot: int) -> None: ...


class StepObserver(Protocol):
    """Host-side per-step observer (metrics, tracing); runs after the step's sync."""

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


class SpecEngine:
    """Runs speculative decoding steps for up to `config.max_batch_size` concurrent requests."""

    def __init__(
        self,
        config: SpecConfig,
        runner: TargetRunner,
        strategies: Strategies,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        observers: tuple[StepObserver, ...] = (),
    ) -> None:
        self.config = config
        self.runner = runner
        self.strategies = strategies
        self.device = torch.device(device)
        self.observers = observers
        self.generator = generator
        B = config.max_batch_size
        N = strategies.drafter.num_tree_slots
        if N > config.num_tree_slots:
            raise ConfigError(f"drafter proposes {N} tree slots, more than config.num_tree_slots={config.num_tree_slots}")
        self.num_slots_tree = N
        dev = self.device
        i64 = dict(dtype=torch.int64, device=dev)
        # Per-slot decoding state: fixed capacity, padding slots inactive.
        self.root_tokens = torch.zeros(B, **i64)  # [B] newest token, KV not cached
        self.committed_len = torch.zeros(B, **i64)  # [B] tokens with target KV
        self.accept_length = torch.full((B,), -1, **i64)  # [B] last step's accepted drafts
        self.accept_tokens = torch.full((B, N), -1, **i64)  # [B, N] last step's emitted tokens
        self.active = torch.zeros(B, dtype=torch.bool, device=dev)  # [B]
        self.hidden_path: torch.Tensor | None = None  # [B, N, d*n_capture] along the accepted path
        self.tree_buf = TreeMeta.empty(B, N, dev)
        self.sampling = SamplingTensors.from_params([SamplingParams()] * B, dev)
        self.slot_generators: list[torch.Generator | None] = [None] * B
        self.requests: list[RequestState | None] = [None] * B
        self.committed_host = [0] * B  # host copy of committed_len, updated at the hand-off
        self.eos_token_ids = tuple(runner.info.eos_token_ids)

    # ------------------------------------------------------------------ requests
    def free_slots(self) -> list[int]:
        return [s for s, r in enumerate(self.requests) if r is None]

    def check_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise `ConfigError` if `prompt` / `params` cannot run; touches no state."""
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"sampling must be a SamplingParams, got {type(params).__name__}")
        if getattr(self.strategies.verifier, "greedy_only", False) and not params.greedy:
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
        need = len(prompt) + params.max_new_tokens + self.num_slots_tree
        if need > self.config.max_seq_len:
            raise ConfigError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={params.max_new_tokens} + "
                f"{self.num_slots_tree} tree slots = {need} exceeds max_seq_len={self.config.max_seq_len}"
            )

    def add_request(self, prompt: list[int], params: SamplingParams) -> RequestState:
        """Prefill `prompt` into a free slot and sample its first token."""
        self.check_request(prompt, params)
        free = self.free_slots()
        if not free:
            raise ConfigError(f"all {self.config.max_batch_size} request slots are busy (max_batch_size)")
        slot = free[0]
        self.runner.reserve(slot, len(prompt) + self.num_slots_tree)
        prompt_t = torch.tensor(prompt, dtype=torch.int64, device=self.device)
        logits, hidden = self.runner.prefill(slot, prompt_t)  # [V], [L, d*nc]
        self._set_sampling(slot, params)
        probs = sampling_probs(
            logits[None],
            self.sampling.temperature[slot : slot + 1],
            self.sampling.top_k[slot : slot + 1],
            self.sampling.top_p[slot : slot + 1],
            self.sampling.min_p[slot : slot + 1],
        )  # [1, V]
        u = torch.rand(1, generator=self._gen(slot), device=self.device, dtype=torch.float64)
        first = sample_from_probs(probs, u)  # [1]
        next_tokens = torch.cat([prompt_t[1:], first])  # [L]
        self.strategies.drafter.prefill(slot, next_tokens, hidden)

        self.root_tokens[slot] = first[0]
        self.committed_len[slot] = len(prompt)
        self.committed_host[slot] = len(prompt)
        self.accept_length[slot] = -1
        self.accept_tokens[slot] = -1
        self.active[slot] = True
        request = RequestState(slot=slot, prompt=list(prompt), params=params)
        self.requests[slot] = request
        self._emit(request, [int(first[0])])  # host sync (prefill is not the hot loop)
        return request

    def _set_sampling(self, slot: int, params: SamplingParams) -> None:
        self.sampling.temperature[slot] = float(params.temperature)
        self.sampling.top_k[slot] = int(params.top_k)
        self.sampling.top_p[slot] = float(params.top_p)
        self.sampling.min_p[slot] = float(params.min_p)
        if params.seed is None:
            self.slot_generators[slot] = None
        else:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
            self.slot_generators[slot] = gen

    def _gen(self, slot: int) -> torch.Generator | None:
        return self.slot_generators[slot] or self.generator

    def _uniforms(self) -> torch.Tensor:
        """[B, N, 2] float64 draws; seeded slots draw from their own generator."""
        B, N = self.config.max_batch_size, self.num_slots_tree
        u = torch.rand(B, N, 2, generator=self.generator, device=self.device, dtype=torch.float64)
        for slot, gen in enumerate(self.slot_generators):
            if gen is not None:
                u[slot] = torch.rand(N, 2, generator=gen, device=self.device, dtype=torch.float64)
        return u

    # ------------------------------------------------------------------ the step
    def step(self) -> None:
        """One speculative step for every active slot, ending in the token hand-off."""
        s = self.strategies
        N = self.num_slots_tree
        kv_len = 0
        for slot, request in enumerate(self.requests):  # host: back the tree's KV slots
            if request is not None:
                need = self.committed_host[slot] + N
                self.runner.reserve(slot, need)
                kv_len = max(kv_len, need)
        # Static key bound for attention, bucketed so compiled shapes stay few.
        kv_len = min(-(-kv_len // KV_LEN_BUCKET) * KV_LEN_BUCKET, self.config.max_seq_len)

        # 1. capture: the target states along last step's accepted path (gathered in _advance).
        draft = s.drafter.propose(
            DraftInput(
                root_tokens=self.root_tokens,
                committed_len=self.committed_len,
                accept_length=self.accept_length,
                accept_tokens=self.accept_tokens,
                hidden=self.hidden_path,
                active=self.active,
                sampling=self.sampling,
            )
        )
        # 2. draft done; 3. build tree (idle slots keep a root-only tree)
        num_nodes = torch.where(self.active, draft.num_nodes, torch.zeros_like(draft.num_nodes))  # [B]
        tree = s.build_tree(draft.parents, draft.num_nodes, out=self.tree_buf)
        logits, captured = self.runner.verify(draft.tokens, tree, self.committed_len, num_nodes, kv_len)  # [B, N, V]
        # 4. verify
        acc = s.verifier(
            draft.tokens, tree, logits, self.sampling, draft_probs=draft.draft_probs, uniforms=self._uniforms()
        )
        accept_length = torch.where(self.active, acc.accept_length, torch.zeros_like(acc.accept_length))
        # 5. relocate the accepted nodes' KV to linear slots
        s.relocate_kv(self.runner.cache, self.committed_len, acc.accept_nodes, accept_length)
        self._advance(acc.accept_nodes, acc.accept_tokens, accept_length, captured)

        # Token hand-off: the one host sync of the step.
        lengths = accept_length.tolist()
        tokens = self.accept_tokens.tolist()
        for slot, request in enumerate(self.requests):
            if request is None:
                continue
            a = lengths[slot]
            self.committed_host[slot] += a + 1
            request.accepted_per_step.append(a)
            self._emit(request, tokens[slot][: a + 1])
        for obs in self.observers:
            obs.on_step(self, lengths)

    def _advance(self, accept_nodes, accept_tokens, accept_length, captured) -> None:
        """Device-side state update after verification (no sync)."""
        active = self.active
        self.accept_length = torch.where(active, accept_length, self.accept_length)
        self.accept_tokens = torch.where(active[:, None], accept_tokens, self.accept_tokens)
        bonus = accept_tokens.gather(1, accept_length.clamp(min=0)[:, None])[:, 0]  # [B]
        self.root_tokens = torch.where(active, bonus, self.root_tokens)
        self.committed_len = self.committed_len + torch.where(active, accept_length + 1, 0)
        if captured is not None:
            idx = accept_nodes.clamp(min=0)  # [B, N]; rows past accept_length are undefined
            self.hidden_path = captured.gather(1, idx[:, :, None].expand(-1, -1, captured.shape[-1]))

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
        self.active[slot] = False
        self.runner.free(slot)
        self.strategies.drafter.reset_slot(slot)

    def has_work(self) -> bool:
        return any(r is not None for r in self.requests)

    def run_until_done(self, max_steps: int | None = None) -> None:
        steps = 0
        while self.has_work():
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"requests still running after max_steps={max_steps}")
            self.step()
            steps += 1
