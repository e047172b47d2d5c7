"""Self-distillation data: the target's own responses to the prompts, generated in big batches.

Owns the batched generation loop over the target's paged KV cache (specdec's runtime: one
prefill forward per batch of prompts, then one decode forward per new token for the whole
batch; greedy or sampled) and `DistillData`, the packed training sequences
(prompt + response tokens, prompt lengths, prompt kinds) with save/load. It never trains
and never looks at a draft head.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec.runtime.batch import decode_batch, prefill_batch
from specdec.runtime.kv_cache import PagedKVCache

from .prompts import Prompt, encode_prompt

__all__ = ["DistillData", "generate_responses", "build_distill_data"]

ROUND_BATCHES = 8  # batches per shuffled round (prompts are length-sorted within a round)
SAVE_EVERY_S = 30.0  # resumable generation: save the responses so far at most this often (and at the end)


@dataclass
class DistillData:
    """Training sequences packed back to back.

    tokens: [total] int32, sequence i is tokens[offsets[i]:offsets[i+1]] = prompt + response;
    prompt_lens: [n] int64; kinds: prompt kind of each sequence; meta: how it was made.
    """

    tokens: torch.Tensor  # [total] int32
    offsets: torch.Tensor  # [n + 1] int64
    prompt_lens: torch.Tensor  # [n] int64
    kinds: list[str]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.prompt_lens.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """[n] int64 sequence lengths."""
        return self.offsets[1:] - self.offsets[:-1]

    def sequence(self, i: int) -> torch.Tensor:
        """[L] int64 tokens of sequence i."""
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])].to(torch.int64)

    @property
    def num_response_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())

    def subset(self, index: list[int]) -> "DistillData":
        seqs = [self.sequence(i) for i in index]
        return DistillData.pack(seqs, [int(self.prompt_lens[i]) for i in index], [self.kinds[i] for i in index], self.meta)

    @staticmethod
    def pack(seqs: list[torch.Tensor], prompt_lens: list[int], kinds: list[str], meta: dict | None = None) -> "DistillData":
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
        offsets = torch.zeros(len(seqs) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        tokens = torch.cat([torch.as_tensor(s, dtype=torch.int32) for s in seqs]) if seqs else torch.zeros(0, dtype=torch.int32)
        return DistillData(tokens, offsets, torch.tensor(prompt_lens, dtype=torch.int64), list(kinds), dict(meta or {}))

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(
            {"tokens": self.tokens, "offsets": self.offsets, "prompt_lens": self.prompt_lens, "kinds": self.kinds, "meta": self.meta},
            tmp,
        )
        tmp.replace(path)
        return path

    @staticmethod
    def load(path) -> "DistillData":
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        return DistillData(state["tokens"], state["offsets"], state["prompt_lens"], list(state["kinds"]), dict(state["meta"]))


def _pick(logits: torch.Tensor, temperature: torch.Tensor | None, generator: torch.Generator | None) -> torch.Tensor:
    """logits [b, V] float32 -> next tokens [b] int64: the argmax on rows whose temperature is 0
    (all rows when `temperature` is None), a draw at the row's temperature elsewhere.
    temperature: [b] float32 or None."""
    greedy = logits.argmax(-1)
    if temperature is None:
        return greedy
    probs = torch.softmax(logits / temperature.clamp_min(1e-6)[:, None], dim=-1)
    drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return torch.where(temperature > 0, drawn, greedy)


@torch.inference_mode()
def generate_responses(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    eos_token_ids: tuple[int, ...],
    temperature: float | list[float] = 0.0,
    seed: int = 0,
    block_size: int = 16,
    deadline: float | None = None,
    progress: bool = True,
    cuda_graph: bool = False,
    on_batch: Callable[[list[list[int] | None]], None] | None = None,
) -> list[list[int] | None]:
    """The target's responses to `prompts`, `batch_size` prompts per forward.

    Prompts are shuffled (seeded) into rounds of `ROUND_BATCHES` batches, and sorted by
    length within a round, so batches waste little padding and a deadline drops a random
    share of the prompts, not the shortest. One paged cache sized for the longest prompt serves
    every batch. A response ends after its first EOS (kept) or at `max_new_tokens`.

    Args:
        model: a `DecoderLM` (its device and dtype are used).
        prompts: token ids per prompt (each non-empty).
        temperature: 0 = greedy; one number for every prompt or one per prompt.
        deadline: `time.perf_counter()` value after which no new batch starts; prompts not
            reached get None.
        cuda_graph: replay the decode forward from a CUDA graph (CUDA only; checked against
            the eager forward once, eager on any failure).
        on_batch: called with the responses so far (None = not yet generated) after every
            batch, e.g. to save them so that a later call can resume.
    Returns:
        responses in the order of `prompts` (None = not generated before the deadline).
    """
    temps = [float(temperature)] * len(prompts) if isinstance(temperature, (int, float)) else [float(t) for t in temperature]
    if len(temps) != len(prompts):
        raise ValueError(f"{len(temps)} temperatures for {len(prompts)} prompts; give one number or one per prompt")
    bad = [t for t in temps if not t >= 0]
    if bad:
        raise ValueError(f"temperature={bad[0]} must be >= 0")
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} and batch_size={batch_size} must be >= 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    out: list[list[int] | None] = [None] * len(prompts)
    if not prompts:
        return out
    p0 = next(model.parameters())
    device = p0.device
    bs = min(batch_size, len(prompts))
    shuffled = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    rounds = [shuffled[i : i + ROUND_BATCHES * bs] for i in range(0, len(shuffled), ROUND_BATCHES * bs)]
    order = [i for r in rounds for i in sorted(r, key=lambda i: (-len(prompts[i]), i))]
    max_len = max(len(p) for p in prompts) + max_new_tokens
    cache = PagedKVCache(
        model.config.num_layers,
        model.num_kv_heads_per_layer,
        model.head_dim,
        max_batch_size=bs,
        max_seq_len=max_len,
        block_size=block_size,
        device=device,
        dtype=p0.dtype,
    )
    eos = torch.tensor(sorted(set(eos_token_ids)) or [-1], device=device)
    generator = None
    if any(t > 0 for t in temps):
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    chunks = [order[i : i + bs] for i in range(0, len(order), bs)]
    bar = _progress(len(prompts), progress)
    step_fn = _DecodeStep(model, cache, bs, device, cuda_graph)
    for chunk in chunks:
        if deadline is not None and time.perf_counter() > deadline:
            break
        real = len(chunk)
        if step_fn.static_shape:  # a CUDA graph needs every batch at full width: pad with copies
            chunk = chunk + [chunk[0]] * (bs - real)
        b = len(chunk)
        lens = [len(prompts[i]) for i in chunk]
        T = max(lens)
        for s in range(bs):
            cache.free(s)
        for s, L in enumerate(lens):
            cache.reserve(s, L + max_new_tokens)
        tokens = torch.zeros(b, T, dtype=torch.int64)
        for s, i in enumerate(chunk):
            tokens[s, : lens[s]] = torch.tensor(prompts[i])
        tokens = tokens.to(device)
        row_temps = None  # [b] float32, only when a row of this batch samples
        if any(temps[i] > 0 for i in chunk):
            row_temps = torch.tensor([temps[i] for i in chunk], dtype=torch.float32, device=device)
        q_len = torch.tensor(lens, dtype=torch.int64, device=device)
        slots = torch.arange(b, device=device)
        batch = prefill_batch(cache, slots, torch.zeros_like(q_len), q_len, T)
        logits = model(tokens, batch.positions, cache, batch, logits_index=(q_len - 1)[:, None]).logits[:, 0]
        nxt = _pick(logits, row_temps, generator)  # [b]
        steps = [nxt]
        done = torch.isin(nxt, eos)
        cache_len = q_len.clone()
        for step in range(1, max_new_tokens):
            logits = step_fn(nxt, cache_len)  # [b, V] float32
            nxt = torch.where(done, eos[0], _pick(logits, row_temps, generator))
            steps.append(nxt)
            cache_len = cache_len + 1
            done = done | torch.isin(nxt, eos)
            if step % 16 == 0 and bool(done[:real].all()):  # one host sync every 16 tokens
                break
        gen = torch.stack(steps, 1).cpu().tolist()  # [b, <= max_new_tokens]
        eos_set = set(eos_token_ids)
        for s, i in enumerate(chunk[:real]):
            resp = gen[s]
            cut = next((j + 1 for j, t in enumerate(resp) if t in eos_set), len(resp))
            out[i] = resp[:cut]
        if bar is not None:
            bar.update(real)
        if on_batch is not None:
            on_batch(out)
    if bar is not None:
        bar.close()
    return out


def _can_graph(device: torch.device) -> bool:
    return device.type == "cuda"


class _DecodeStep:
    """One greedy-decode forward of all rows: eager, or replayed from a CUDA graph.

    The graph (``cuda_graph=True`` on a CUDA device) is captured on first use over static
    token / length buffers and checked once against the eager forward of the same step (both
    write the same K/V); on any failure or mismatch it is dropped with a warning and the eager
    forward is used. With a graph, every batch must have `bs` rows (`static_shape`).
    """

    def __init__(self, model, cache, bs: int, device: torch.device, cuda_graph: bool):
        self.model, self.cache, self.bs = model, cache, bs
        self.static_shape = bool(cuda_graph) and _can_graph(device)
        self.graph = None
        self.tried = False

    def eager(self, tokens: torch.Tensor, cache_len: torch.Tensor) -> torch.Tensor:
        active = torch.ones_like(cache_len, dtype=torch.bool)
        batch = decode_batch(self.cache, cache_len, active)
        return self.model(tokens[:, None], batch.positions, self.cache, batch).logits[:, 0]

    def _capture(self, tokens: torch.Tensor, cache_len: torch.Tensor) -> None:
        self.tried = True
        try:
            self.tokens, self.cache_len = tokens.clone(), cache_len.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up (Triton compilation); writes this step's own K/V rows
                for _ in range(2):
                    self.eager(self.tokens, self.cache_len)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.logits = self.eager(self.tokens, self.cache_len)
            ref = self.eager(tokens, cache_len)
            graph.replay()
            if not torch.equal(self.logits.argmax(-1), ref.argmax(-1)):
                raise RuntimeError("graph replay differs from the eager forward")
            self.graph = graph
        except Exception as err:  # noqa: BLE001 - any capture problem: fall back to eager
            warnings.warn(f"CUDA-graph decode disabled ({type(err).__name__}: {err}); decoding eagerly", stacklevel=2)
            self.graph = None
            torch.cuda.synchronize()

    def __call__(self, tokens: torch.Tensor, cache_len: torch.Tensor) -> torch.Tensor:
        """tokens, cache_len: [b] int64 -> logits [b, V] float32 (K/V written at cache_len)."""
        if self.static_shape and not self.tried:
            self._capture(tokens, cache_len)
        if self.graph is None:
            return self.eager(tokens, cache_len)
        self.tokens.copy_(tokens)
        self.cache_len.copy_(cache_len)
        self.graph.replay()
        return self.logits


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    return tqdm(total=total, desc="generate", unit="resp", smoothing=0.1)


def _resume_key(encoded: list[list[int]], temps: list[float], max_new_tokens: int, seed: int, eos) -> str:
    """A fingerprint of what a generation answers and how (prompts' tokens, temperatures, limits)."""
    h = hashlib.sha1(repr((max_new_tokens, seed, sorted(eos), temps)).encode())
    for ids in encoded:
        h.update(repr(ids).encode())
    return h.hexdigest()


def _load_responses(path: Path | None, key: str, n: int) -> list[list[int] | None]:
    """The saved responses of the generation `key`, or n Nones (no file, or another generation's)."""
    if path is None or not Path(path).is_file():
        return [None] * n
    saved = torch.load(path, weights_only=True)
    if saved.get("key") != key or len(saved.get("responses", ())) != n:
        print(f"[specdec.train] {path} holds another generation's responses (other prompts or settings); starting over")
        return [None] * n
    return list(saved["responses"])


def _save_responses(path: Path, key: str, responses: list[list[int] | None]) -> None:
    """Write the responses so far atomically (a tmp file, then a rename): a kill mid-write keeps the last."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "responses": responses}, tmp)
    tmp.replace(path)


def build_distill_data(
    target,
    prompts: list[Prompt],
    *,
    max_new_tokens: int,
    batch_size: int,
    max_prompt_tokens: int = 512,
    temperature: float = 0.0,
    variant_temperature: float = 0.8,
    seed: int = 0,
    deadline: float | None = None,
    progress: bool = True,
    cuda_graph: bool = False,
    encode: Callable[[Prompt, object, int | None], list[int]] = encode_prompt,
    resume_path: Path | None = None,
) -> DistillData:
    """Encode `prompts`, let the target answer them, and pack prompt + response sequences.

    Prompts longer than `max_prompt_tokens` are dropped; so are prompts not reached before
    `deadline`. A prompt's sampled variants (`Prompt.variant` > 0) are answered at
    `variant_temperature`, the rest at `temperature`. `meta` records counts, settings and the
    generation time. `encode(prompt, tokenizer, vocab_size) -> ids` turns a prompt into tokens
    (default `prompts.encode_prompt`; `conversation.encode_any` for data holding multi-turn prompts).

    With `resume_path`, the responses so far are saved there after every batch (with a key of
    the prompts' tokens and the generation settings), and a later call with the same prompts and
    settings answers only the prompts still unanswered: a generation cut by a deadline (or a
    lost machine) continues where it stopped. meta["resumed"] counts the responses reused.
    """
    start = time.perf_counter()
    encoded, kept = [], []
    for p in prompts:
        ids = encode(p, target.tokenizer, target.info.vocab_size)
        if 0 < len(ids) <= max_prompt_tokens:
            encoded.append(ids)
            kept.append(p)
    if any(p.variant for p in kept) and not variant_temperature > 0:
        raise ValueError(f"variant_temperature={variant_temperature} must be > 0: sampled variants of a prompt "
                         f"answered greedily would repeat its answer")
    temps = [variant_temperature if p.variant else temperature for p in kept]
    key = _resume_key(encoded, temps, max_new_tokens, seed, target.info.eos_token_ids)
    responses = _load_responses(resume_path, key, len(encoded))
    resumed = sum(r is not None for r in responses)
    todo = [i for i, r in enumerate(responses) if r is None]

    def merge(new: list[list[int] | None]) -> None:  # this call's answers (in `todo` order) into `responses`
        for i, r in zip(todo, new):
            responses[i] = r

    last_save = time.perf_counter()

    def checkpoint(new: list[list[int] | None]) -> None:  # after a batch: save at most every SAVE_EVERY_S
        nonlocal last_save
        if time.perf_counter() - last_save >= SAVE_EVERY_S:
            merge(new)
            _save_responses(resume_path, key, responses)
            last_save = time.perf_counter()

    new_tokens = 0  # response tokens this call generated (the rest were resumed)
    if todo:
        if resumed:
            print(f"[specdec.train] resuming generation: {resumed} of {len(encoded)} prompts already answered")
        new = generate_responses(
            target.model,
            [encoded[i] for i in todo],
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            eos_token_ids=tuple(target.info.eos_token_ids),
            temperature=[temps[i] for i in todo],
            seed=seed + resumed,  # a resumed call draws other samples than the first call's first batches
            deadline=deadline,
            progress=progress,
            cuda_graph=cuda_graph,
            on_batch=checkpoint if resume_path is not None else None,
        )
        merge(new)
        new_tokens = sum(len(r) for r in new if r)
        if resume_path is not None:
            _save_responses(resume_path, key, responses)
    seqs, prompt_lens, kinds = [], [], []
    for ids, resp, p in zip(encoded, responses, kept):
        if resp:
            seqs.append(torch.tensor(ids + resp, dtype=torch.int32))
            prompt_lens.append(len(ids))
            kinds.append(p.kind)
    seconds = time.perf_counter() - start
    meta = dict(
        prompts_asked=len(prompts),
        prompts_too_long=len(prompts) - len(kept),
        prompts_not_reached=sum(r is None for r in responses),
        resumed=resumed,
        new_response_tokens=new_tokens,
        variants=sum(1 for p in kept if p.variant),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        variant_temperature=variant_temperature,
        seed=seed,
        batch_size=batch_size,
        seconds=round(seconds, 2),
    )
    data = DistillData.pack(seqs, prompt_lens, kinds, meta)
    data.meta["response_tokens"] = data.num_response_tokens
    data.meta["total_tokens"] = int(data.tokens.numel())
    return data
