"""`SpecDecoder`: the user-facing entry point (load, compose, generate).

Owns turning user inputs (paths, strings or token lists, sampling params) into engine
requests and results with stats. The step logic lives in `specdec.engine`; strategies and
their sizes come from the plugins through `pipeline.build` (resolved once).
"""

from __future__ import annotations

import dataclasses
import numbers
import time
import warnings
from dataclasses import dataclass, field

import pluggy
import torch

from .chat import encode_conversation, is_conversation
from ..config import ConfigError, SamplingParams, SpecConfig
from ..cpu_threads import apply_threads
from ..engine.engine import SpecEngine
from ..pipeline import build
from ..validation import check_device, check_dtype

__all__ = ["SpecDecoder", "GenerationResult", "GenerationStats"]


def _knob(name: str, value, device: torch.device) -> bool:
    """'auto' -> on for CUDA, off elsewhere; True for CUDA graphs needs CUDA."""
    if value == "auto":
        return device.type == "cuda"
    if name == "cuda_graphs" and value and device.type != "cuda":
        raise ConfigError(f"cuda_graphs=True needs a CUDA target; the target is on {device} (use 'auto' or False)")
    return bool(value)

def _as_int(token):
    """An integer-like token id (int, numpy int, 0-d integer tensor) as an int; anything else as it is."""
    if isinstance(token, bool):
        return token
    if isinstance(token, numbers.Integral):
        return int(token)
    if isinstance(token, torch.Tensor) and token.dim() == 0 and not token.dtype.is_floating_point and token.dtype != torch.bool:
        return int(token)
    return token


WEAK_DRAFTER_MIN_STEPS = 32  # judge a drafter only after this many steps in one generate()
WEAK_DRAFTER_MAX_ACCEPTED = 0.05  # warn below this many accepted draft tokens per step


@dataclass
class GenerationStats:
    """steps: target forwards after prefill; accepted_per_step: draft tokens accepted each step;
    mean_accept_length: tokens emitted per target forward (prefill's first token excluded),
    None for a request that ended on its first token (no step ran);
    finish_reason: "stop", "eos", "length", "aborted" or "error" (then `error` says why);
    acceptance_by_depth: for d = 1, 2, ...: of the steps that verified a draft at depth d,
    the share that accepted it (the per-depth acceptance histogram);
    preemptions: times the request was preempted for KV blocks (its KV recomputed)."""

    steps: int
    accepted_per_step: list[int]
    mean_accept_length: float | None
    lossless: bool  # the verifier provably preserves the target's output
    finish_reason: str | None
    seconds: float = 0.0
    error: str | None = None
    acceptance_by_depth: list[float] = field(default_factory=list)
    preemptions: int = 0


def acceptance_by_depth(accepted: list[int], budgets: list[int]) -> list[float]:
    """Share of steps that accepted depth d among the steps whose budget reached depth d."""
    depth = max(budgets, default=0)
    rates = []
    for d in range(1, depth + 1):
        tried = sum(1 for b in budgets if b >= d)
        rates.append(sum(1 for a, b in zip(accepted, budgets) if b >= d and a >= d) / tried if tried else 0.0)
    return rates


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int) -> None:
        pass


def _progress_bar(total: int, show: bool):
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="request")


@dataclass
class GenerationResult:
    token_ids: list[int]  # the new tokens
    text: str | None  # decoded new tokens, when the target has a tokenizer
    stats: GenerationStats
    prompt_token_ids: list[int] = field(default_factory=list)


class SpecDecoder:
    """A target, a drafter, a tree shape and a verifier, composed by `SpecConfig`.

    Example:
        dec = SpecDecoder.from_pretrained(target_path, "heads/eagle3", SpecConfig(drafter="eagle3"))
        out = dec.generate(["def fib(n):"], SamplingParams(max_new_tokens=64))
    """

    def __init__(self, target, config: SpecConfig, *, pm: pluggy.PluginManager | None = None, seed: int = 0):
        from ..distributed import SINGLE, check_spmd
        from ..compile_scope import inductor_options
        from ..models.fused import EAGER, compiled, use_compiled
        from ..models.linear import use_small_linear
        from ..runtime.runner import ModelRunner

        self.target = target
        self.config = config
        self.tp = getattr(target.model, "tp", SINGLE)  # the target's tensor-parallel group (size 1: none)
        check_spmd(config, self.tp.size)
        info = dataclasses.replace(target.info, model=target.model)
        self.pipeline = build(config, info, pm)  # the strategies and every derived size, once
        self.strategies = self.pipeline.strategies
        device = next(target.model.parameters()).device
        if device.type == "cpu":
            apply_threads(config.execution.threads)  # the cores other work leaves idle (`cpu_threads`)
        caps = self.strategies.drafter_caps
        self.compiled = _knob("compile", config.execution.compile, device)  # "step" compiles the pieces too
        self.compile_step = config.execution.compile == "step"  # and the whole step, one graph per bucket
        self.cuda_graphs = _knob("cuda_graphs", config.execution.cuda_graphs, device)
        runner = ModelRunner(
            target,
            config,
            self.strategies.capture_layers,
            self.pipeline.sizes.num_tree_slots,
            keep_last_hidden=caps.reads == "last_hidden",
        )
        options = {"combo_kernels": True} if config.execution.combo_kernels else {}
        with inductor_options(**options):  # the compiled pieces below are made with these
            runner.cache.use_compiled(self.compiled)
            if caps.attach is not None:
                caps.attach(runner.cache)  # the draft KV goes on the target's block allocator
            pieces = compiled() if self.compiled else EAGER  # this decoder's own graphs (`compile_scope`)
            use_compiled(target.model, pieces=pieces)
            for module in caps.modules:
                use_compiled(module, pieces=pieces)
            if caps.use_compiled is not None:
                caps.use_compiled(self.compiled)
            for module in (target.model, *caps.modules):  # CPU tensors keep F.linear (the interpreter aside)
                use_small_linear(module, config.execution.small_linear)
            gen = torch.Generator().manual_seed(seed)
            self.engine = SpecEngine(
                config, runner, self.strategies, device=device, generator=gen, cuda_graphs=self.cuda_graphs,
                compiled=self.compiled, compile_step=self.compile_step,
            )
        self._warned_weak_drafter = False

    def warmup(self, *, progress: bool = True):
        """Compile (when `compile` is on) and capture one CUDA graph per batch bucket (when
        `cuda_graphs` is on) before the first request; returns a `WarmupReport` (seconds,
        buckets, graphs). `generate` calls it lazily when either knob is on."""
        return self.engine.warmup(progress=progress)

    def add_observer(self, observer) -> None:
        """Run `observer.on_step(engine, accept_length)` on the host after every step's hand-off."""
        self.engine.observers.append(observer)

    @property
    def step_times(self):
        """`step_timing.StepTimes` of every step so far: ms per step, and draft / verify / rest
        for the steps run with `time_phases()` on."""
        return self.engine.step_times

    def time_phases(self, on: bool = True) -> None:
        """Split each following step into draft / verify / rest (`step_times`). The split needs
        boundaries a captured graph does not have, so steps then run eagerly (compiled pieces
        stay compiled): a profile mode, slower with CUDA graphs on. No extra host sync."""
        self.engine.phase_timing = bool(on)

    @classmethod
    def from_pretrained(
        cls,
        target,
        draft=None,
        config: SpecConfig | None = None,
        *,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        pm: pluggy.PluginManager | None = None,
        seed: int = 0,
        tp_size: int = 1,
    ) -> "SpecDecoder":
        """Load `target` (HF folder, .gguf, or an already loaded `Target`) and compose it with a drafter.

        `draft` is the drafter's checkpoint (path or model object); it is handed to the drafter
        plugin as `config.plugin_options[config.drafter]["checkpoint"]`. A draft given to a
        drafter that runs no model (`drafter_caps.modules` empty, e.g. target-only or n-gram
        drafting) is an error, never silently ignored. `device` ("cpu", "cuda", "cuda:N") and
        `dtype` (a torch dtype or its name) are checked before anything loads.

        `tp_size` > 1 shards the target over that many ranks of a torch.distributed job
        (Megatron-style tensor parallelism, `specdec.distributed`): call it in every process of a
        `torchrun --nproc-per-node N` job (the process group is created from torchrun's
        environment when none exists; NCCL on CUDA with `NCCL_NVLS_ENABLE=0`, gloo on the CPU), with
        the same arguments everywhere. Each rank loads only its shard; the draft head is replicated.
        Every rank then runs the same engine on the same requests with the same seeds (SPMD) and
        gets the same tokens; report from rank 0 (`decoder.tp.rank == 0`). `device="cuda"` means
        `cuda:LOCAL_RANK`. Not with `adaptive=True` (each rank would time its own steps and choose
        differently) nor with the threaded `AsyncEngine` / server (admission by wall clock).
        A `tp_size` that does not split the model's heads / ffn, exceeds or does not divide the
        world size, or has no process group to run in is a `ConfigError` before any weight loads.
        """
        from ..distributed import SINGLE, check_spmd, check_tp_size, tensor_parallel_group
        from ..models import load_target

        config = SpecConfig() if config is None else config
        if not isinstance(config, SpecConfig):
            raise ConfigError(f"config must be a SpecConfig, got {type(config).__name__}")
        check_spmd(config, check_tp_size(tp_size))
        if not hasattr(target, "model"):
            dev, dt = check_device(device), check_dtype(dtype)
            tp, dev = tensor_parallel_group(tp_size, dev)
            target = load_target(target, device=dev, dtype=dt, tp=tp)
        elif getattr(target.model, "tp", SINGLE).size != tp_size:
            held = getattr(target.model, "tp", SINGLE).size
            raise ConfigError(f"tp_size={tp_size}, but the given target was loaded with tp_size={held}; pass tp_size={held}")
        if draft is not None:
            options = dict(config.plugin_options)
            options[config.drafter] = {**options.get(config.drafter, {}), "checkpoint": draft}
            config = dataclasses.replace(config, plugin_options=options)
        decoder = cls(target, config, pm=pm, seed=seed)
        if draft is not None and not decoder.strategies.drafter_caps.modules:
            raise ConfigError(
                f"a draft checkpoint ({draft!s}) was given, but drafter={config.drafter!r} runs no model and would "
                "ignore it; name the drafter that loads it (e.g. SpecConfig(drafter=...), see `specdec plugins`) "
                "or leave draft=None"
            )
        return decoder

    # ------------------------------------------------------------------ generate
    def _encode(self, prompt, index: int | None = None) -> list[int]:
        """A prompt's token ids: a conversation (a list of {"role", "content"} dicts) through the
        target's chat template, a string through its tokenizer (a completion), a 1-D integer
        tensor or a list of ids as they are. Integer-like ids (numpy ints) become ints; other
        entries are kept, for `check_request` to name. Errors name the prompt's `index`."""
        where = "" if index is None else f"prompt {index}: "
        tok = self.target.tokenizer
        if is_conversation(prompt):
            return encode_conversation(tok, prompt, index=index)
        if isinstance(prompt, str):
            if tok is None:
                raise ConfigError(where + "string prompts need a target with a tokenizer; pass token-id lists")
            return list(tok(prompt, add_special_tokens=False)["input_ids"])
        if isinstance(prompt, torch.Tensor):
            if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
                raise ConfigError(where + f"a tensor prompt must hold integer token ids, got dtype {prompt.dtype}")
            if prompt.dim() > 2 or (prompt.dim() == 2 and prompt.shape[0] != 1):
                raise ConfigError(where + f"a tensor prompt must be [T] or [1, T], got shape {tuple(prompt.shape)}")
            return [int(t) for t in prompt.reshape(-1).tolist()]
        if not isinstance(prompt, (list, tuple)):
            raise ConfigError(
                where + "a prompt must be a string, a conversation (list of {'role', 'content'} dicts), a list of "
                f"token ids or a 1-D integer tensor, got {type(prompt).__name__}"
            )
        return [_as_int(t) for t in prompt]

    def chat(self, conversations, sampling: SamplingParams | list[SamplingParams] | None = None, **kwargs):
        """Answer one conversation (a list of {"role", "content"} dicts) or a list of them,
        through the target tokenizer's chat template (with the assistant's generation prompt).

        Every conversation is encoded and checked before any runs; then this is `generate` on
        their token ids (same `sampling` and keyword arguments, results in input order).
        Raises `ConfigError` without a tokenizer or chat template, or for a malformed message.
        """
        if is_conversation(conversations):
            conversations = [conversations]
        if not isinstance(conversations, (list, tuple)) or not conversations:
            raise ConfigError(
                f"chat() needs a conversation (a list of {{'role', 'content'}} dicts) or a list of them, got {conversations!r}"
            )
        many = len(conversations) > 1
        tok = self.target.tokenizer
        encoded = [encode_conversation(tok, c, index=i if many else None) for i, c in enumerate(conversations)]
        return self.generate(encoded, sampling, **kwargs)

    def _prepare(self, prompts, sampling) -> tuple[list[list[int]], list[SamplingParams]]:
        """Prompts (one or many) and their params, encoded and checked, each error naming its prompt."""
        if isinstance(prompts, (str, torch.Tensor)) or is_conversation(prompts) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # one prompt
        if not isinstance(prompts, (list, tuple)):
            raise ConfigError(
                "prompts must be a prompt (string, conversation, token ids, tensor) or a list of them, "
                f"got {type(prompts).__name__}"
            )
        prompts = list(prompts)
        if not prompts:
            raise ConfigError("generate() needs at least one prompt")
        sampling = sampling or SamplingParams()
        params = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        if len(params) != len(prompts):
            raise ConfigError(f"got {len(params)} SamplingParams for {len(prompts)} prompts; give one or one each")
        encoded = [self._encode(p, i if len(prompts) > 1 else None) for i, p in enumerate(prompts)]
        for i, ids in enumerate(encoded):  # validate everything before touching the engine
            self.engine.check_request(ids, params[i], index=i if len(encoded) > 1 else None)
        return encoded, params

    def _submit(self, encoded, params):
        if not self.engine.warmed and (self.compiled or self.cuda_graphs):
            self.warmup(progress=False)
        return [self.engine.enqueue(ids, p) for ids, p in zip(encoded, params)]  # checked by `_prepare`

    def generate(
        self,
        prompts,
        sampling: SamplingParams | list[SamplingParams] | None = None,
        *,
        progress: bool | None = None,
    ) -> list[GenerationResult]:
        """Generate for any number of prompts (token-id lists, or strings with a tokenizer).

        `sampling` is one `SamplingParams` for all, or one per prompt; every prompt is checked
        before any runs. Requests run `max_batch_size` at a time with continuous batching (a
        finished request's slot takes the next waiting prompt between steps). Results come in
        input order; `progress` shows a bar (default: when there are more prompts than slots).
        A request whose prefill or step failed comes back with `finish_reason="error"`; an
        interrupt (Ctrl-C) aborts the call's requests, releases everything and is re-raised.
        """
        encoded, params = self._prepare(prompts, sampling)
        requests = self._submit(encoded, params)
        show = len(requests) > self.config.cache.max_batch_size if progress is None else progress
        start = time.perf_counter()
        try:
            with _progress_bar(len(requests), show) as bar:
                while any(not r.finished for r in requests):
                    done = sum(r.finished for r in requests)
                    self.engine.run_iteration()
                    bar.update(sum(r.finished for r in requests) - done)
        except BaseException:
            for request in requests:
                self.engine.abort(request)
            raise
        seconds = time.perf_counter() - start
        results = [self._result(r, ids, seconds) for ids, r in zip(encoded, requests)]
        self._warn_if_drafts_are_never_accepted(requests)
        failed = [f"prompt {i}: {r.error}" for i, r in enumerate(requests) if r.finish_reason == "error"]
        if failed:
            warnings.warn(f"{len(failed)} request(s) failed: " + "; ".join(failed[:3]), stacklevel=2)
        return results

    def stream(self, prompts, sampling: SamplingParams | list[SamplingParams] | None = None):
        """Like `generate`, but yields a `StreamDelta` per request each time a step hands it
        tokens (index = the prompt's position in the call), its last one with the finish reason.
        Closing the generator early aborts the requests it still had running."""
        from .streaming import IncrementalDetokenizer, StreamDelta

        encoded, params = self._prepare(prompts, sampling)
        requests = self._submit(encoded, params)
        index = {r.id: i for i, r in enumerate(requests)}
        sent = [0] * len(requests)
        detok = [IncrementalDetokenizer(self.target.tokenizer) for _ in requests]
        start = time.perf_counter()
        try:
            while any(not r.finished for r in requests):
                for r in self.engine.run_iteration():
                    i = index.get(r.id)
                    if i is None:
                        continue
                    new = r.token_ids[sent[i]:]
                    sent[i] = len(r.token_ids)
                    if new or r.finished:
                        text = detok[i].push(new, final=r.finished)
                        stats = self._stats(r, time.perf_counter() - start) if r.finished else None
                        yield StreamDelta(i, new, text, r.finish_reason if r.finished else None, r.error, stats)
        finally:
            for request in requests:
                self.engine.abort(request)

    async def astream(self, prompts, sampling: SamplingParams | list[SamplingParams] | None = None):
        """`stream` for asyncio code: the engine runs in a background thread (`AsyncEngine`, started
        on first use and shared by every coroutine), so many callers batch together."""
        import asyncio

        encoded, params = self._prepare(prompts, sampling)
        engine = self.async_engine()
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int):
            async for delta in engine.stream_checked(encoded[i], params[i], index=i):  # checked by `_prepare`
                await merged.put(delta)

        tasks = [asyncio.ensure_future(pump(i)) for i in range(len(encoded))]
        try:
            remaining = len(tasks)
            while remaining:
                delta = await merged.get()
                remaining -= delta.finish_reason is not None
                yield delta
        finally:
            for task in tasks:
                task.cancel()

    def async_engine(self):
        """The decoder's `AsyncEngine` (started on first use)."""
        from .async_engine import AsyncEngine

        if self.tp.size > 1:  # admission by wall clock would differ between ranks
            raise ConfigError(
                f"the AsyncEngine (and the server) cannot run with tp_size={self.tp.size}: each rank would admit "
                "requests at different steps; use generate / stream, which every rank runs in lockstep"
            )
        if getattr(self, "_async", None) is None:
            self._async = AsyncEngine(self).start()
        return self._async

    def _result(self, req, ids: list[int], seconds: float) -> GenerationResult:
        tok = self.target.tokenizer
        text = tok.decode(req.token_ids, skip_special_tokens=True) if tok is not None else None
        return GenerationResult(req.token_ids, text, self._stats(req, seconds), ids)

    def _stats(self, req, seconds: float) -> GenerationStats:
        """A request's `GenerationStats` (streams carry them on their last delta, without the text)."""
        steps = len(req.accepted_per_step)
        emitted_after_prefill = len(req.token_ids) - 1
        mean = emitted_after_prefill / steps if steps else None
        return GenerationStats(
            steps, list(req.accepted_per_step), mean, self.strategies.verifier_caps.lossless, req.finish_reason,
            seconds, error=req.error, acceptance_by_depth=acceptance_by_depth(req.accepted_per_step, req.budget_per_step),
            preemptions=req.preemptions,
        )

    def _warn_if_drafts_are_never_accepted(self, requests) -> None:
        """A drafter that proposes but almost never gets a token accepted is usually a head
        for another target, a wrong capture-layer convention, or an untrained head."""
        if self._warned_weak_drafter or self.pipeline.sizes.num_tree_slots <= 1:
            return
        steps = sum(len(r.accepted_per_step) for r in requests)
        accepted = sum(sum(r.accepted_per_step) for r in requests)
        if steps >= WEAK_DRAFTER_MIN_STEPS and accepted / steps < WEAK_DRAFTER_MAX_ACCEPTED:
            self._warned_weak_drafter = True
            warnings.warn(
                f"drafter={self.config.drafter!r} accepts almost nothing: {accepted} draft tokens accepted in "
                f"{steps} steps (mean acceptance length {1 + accepted / steps:.2f}). Output stays exact, but "
                "there is no speedup: is the head trained for this target, with its capture layers?",
                stacklevel=2,
            )
