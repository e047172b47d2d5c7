"""Typed, validated configuration: what to compose and within which capacities.

Owns `SpecConfig` (the engine's static shape and strategy names) and `SamplingParams`
(per-request sampling). Every rule raises `ConfigError` naming the bad value and the
allowed range; nothing is silently clamped. Strategy *names* are checked against the
installed plugins by `specdec.registry`, not here (third parties add names).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .checks import check_int
from .errors import ConfigError

__all__ = ["ConfigError", "SpecConfig", "SamplingParams", "resolve_capture_layers"]


MAX_TREE_SLOTS = 4096  # N = max_total_draft_tokens + 1 <= this


def _check_number(name: str, value) -> float:
    """`value` as a float, if it is a real number (int or float, never a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number (int or float), got {value!r} ({type(value).__name__})")
    return float(value)


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def _int_tuple(name: str, value) -> tuple:
    """A list or tuple as a tuple; anything else (a bare int, a string, a set) is an error."""
    if not isinstance(value, (tuple, list)):
        raise ConfigError(f"{name} must be a tuple of ints or None, got {value!r} ({type(value).__name__})")
    return tuple(value)


@dataclass(frozen=True)
class SpecConfig:
    """What to compose (strategy names) and the engine's fixed capacities.

    Capacities are static shapes: B = `max_batch_size` request slots and
    N = `max_total_draft_tokens + 1` tree slots per request (node 0 is the root).
    """

    drafter: str = "none"  # drafting strategy, e.g. "eagle3", "none" (target-only)
    tree: str = "linear"  # tree policy: "linear", "dynamic" (EAGLE-2), "static", "sampled", or a plugin's
    verifier: str = "greedy"  # acceptance rule, e.g. "greedy", "target-only", "speculative"
    max_draft_len: int = 5  # D: draft depth (tokens per chain / tree layers)
    topk: int | None = None  # K: children per expanded node, for policies that branch by K
    max_total_draft_tokens: int | None = None  # draft tokens per step, the tree's size; None = max_draft_len * topk (a chain: max_draft_len)
    layers_to_capture: tuple[int, ...] | None = None  # target layer *outputs*; None = drafter default
    max_batch_size: int = 8  # B: request slots
    max_seq_len: int = 2048  # prompt + generated tokens per request, drafts included
    kv_block_size: int = 16  # tokens per paged-KV block
    num_kv_blocks: int | None = None  # None = enough for every slot at max_seq_len
    plugin_options: dict = field(default_factory=dict)  # free-form, keyed by plugin name
    compile: bool | str = "auto"  # torch.compile the model pieces: "auto" = on for CUDA, off on CPU; "step" = the pieces and the whole step as one graph per bucket
    cuda_graphs: bool | str = "auto"  # capture the step per batch bucket: "auto" = on for CUDA
    graph_batch_sizes: tuple[int, ...] | None = None  # batch buckets; None = 1, 2, 4, ... up to max_batch_size
    prefill_chunk_size: int = 512  # prompt tokens per prefill forward (chunked prefill)
    kv_lookahead_steps: int = 4  # KV blocks are reserved this many steps ahead of need
    adaptive: bool = False  # per step, speculate only when the measured cost model says it pays
    overlap: bool = False  # launch each step before reading the last one's hand-off (notes/OVERLAP.md); experimental
    threads: int | str = "auto"  # CPU targets: torch threads; "auto" = the cores other work leaves idle (never more than torch's)

    def __post_init__(self) -> None:
        for name in ("drafter", "tree", "verifier"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty strategy name, got {value!r}")
        check_int("max_draft_len", self.max_draft_len, 1, 64)
        check_int("max_batch_size", self.max_batch_size, 1, 4096)
        check_int("max_seq_len", self.max_seq_len, 2, 1 << 20)
        check_int("kv_block_size", self.kv_block_size, 1, 4096)
        if self.num_kv_blocks is not None:
            check_int("num_kv_blocks", self.num_kv_blocks, 1)
        for name, words in (("compile", ("auto", "step")), ("cuda_graphs", ("auto",))):
            value = getattr(self, name)
            if not (isinstance(value, bool) or (isinstance(value, str) and value in words)):
                allowed = ", ".join([repr(w) for w in words] + ["True", "False"])
                raise ConfigError(f"{name}={value!r} is not allowed; allowed: {allowed}")
        if not isinstance(self.plugin_options, dict):
            raise ConfigError(
                f"plugin_options must be a dict keyed by plugin name, got {self.plugin_options!r} "
                f"({type(self.plugin_options).__name__})"
            )
        check_int("prefill_chunk_size", self.prefill_chunk_size, 1, 1 << 20)
        check_int("kv_lookahead_steps", self.kv_lookahead_steps, 1, 1024)
        if self.threads != "auto":
            if isinstance(self.threads, str):
                raise ConfigError(f"threads={self.threads!r} is not allowed; allowed: 'auto' or an int in [1, 1024]")
            check_int("threads", self.threads, 1, 1024)
        for name in ("adaptive", "overlap"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
        if self.graph_batch_sizes is not None:
            sizes = tuple(self.graph_batch_sizes) if isinstance(self.graph_batch_sizes, (tuple, list)) else None
            if not sizes:
                raise ConfigError(
                    f"graph_batch_sizes={self.graph_batch_sizes!r} must be a non-empty tuple of ints or None"
                )
            for b in sizes:
                check_int("graph_batch_sizes entries", b, 1, self.max_batch_size)
            sizes = tuple(sorted(set(sizes)))
            if sizes[-1] != self.max_batch_size:
                raise ConfigError(
                    f"graph_batch_sizes={sizes} must include max_batch_size={self.max_batch_size} "
                    "(the bucket that holds every slot)"
                )
            object.__setattr__(self, "graph_batch_sizes", sizes)

        # Which tree names exist, and which of topk / max_total_draft_tokens a tree takes, is the
        # tree policy's to say (plugins add policies): `specdec.registry.resolve` checks both.
        if self.topk is not None:
            check_int("topk", self.topk, 1, 64)
        # whether the budget was derived (given as None): `replace` derives it again then, and keeps
        # a value the user chose (an attribute, not a field: flags, equality and repr skip it)
        object.__setattr__(self, "_derived_total", self.max_total_draft_tokens is None)
        if self.max_total_draft_tokens is None:
            object.__setattr__(self, "max_total_draft_tokens", self.max_draft_len * (self.topk or 1))
        check_int("max_total_draft_tokens", self.max_total_draft_tokens, 1, MAX_TREE_SLOTS - 1)

        if self.layers_to_capture is not None:
            layers = _int_tuple("layers_to_capture", self.layers_to_capture)
            for layer in layers:
                if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                    raise ConfigError(f"layers_to_capture entries must be ints >= 0, got {layer!r} in {layers}")
            if len(set(layers)) != len(layers):
                raise ConfigError(f"layers_to_capture={layers} has duplicates; each layer may be captured once")
            object.__setattr__(self, "layers_to_capture", tuple(sorted(layers)))
        if self.max_seq_len <= self.num_tree_slots:
            raise ConfigError(
                f"max_seq_len={self.max_seq_len} must exceed the tree slots N={self.num_tree_slots} "
                "(max_total_draft_tokens + 1)"
            )

    @property
    def num_tree_slots(self) -> int:
        """N: tree node slots per request, root included."""
        return self.max_total_draft_tokens + 1

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """Batch sizes a step runs at (and CUDA graphs are captured for), ascending."""
        if self.graph_batch_sizes is not None:
            return self.graph_batch_sizes
        sizes, b = [], 1
        while b < self.max_batch_size:
            sizes.append(b)
            b *= 2
        return tuple(sizes) + (self.max_batch_size,)

    @property
    def blocks_per_seq(self) -> int:
        """Block-table width: blocks that hold `max_seq_len` tokens."""
        return -(-self.max_seq_len // self.kv_block_size)

    @property
    def total_kv_blocks(self) -> int:
        """Paged-KV pool size in blocks."""
        return self.num_kv_blocks or self.max_batch_size * self.blocks_per_seq

    def replace(self, **changes) -> "SpecConfig":
        """A validated copy with `changes` applied. A derived `max_total_draft_tokens` (left
        None) is derived again from the new depth and width; one the user chose is kept (and
        checked against the new shape by the tree policy), never silently reset."""
        if self._derived_total:
            changes.setdefault("max_total_draft_tokens", None)
        return dataclasses.replace(self, **changes)


def resolve_capture_layers(num_layers: int, layers: tuple[int, ...] | None) -> tuple[int, ...]:
    """Target layer *output* indices to capture (the seed's convention).

    `layers=None` gives the EAGLE-3 default `(1, L//2 - 1, L - 4)`, which needs L > 5 so the
    three layers are distinct. Explicit layers are validated against `[0, L)`; they were
    sorted and de-duplicated by `SpecConfig`.
    """
    check_int("num_layers", num_layers, 1)
    if layers is None:
        if num_layers <= 5:
            raise ConfigError(
                f"default capture layers (1, L//2-1, L-4) need num_layers L > 5, got L={num_layers}; "
                "pass layers_to_capture explicitly"
            )
        default = (1, num_layers // 2 - 1, num_layers - 4)
        if len(set(default)) != 3:
            raise ConfigError(
                f"default capture layers (1, L//2-1, L-4) for L={num_layers} are {default}, not distinct; "
                "pass layers_to_capture explicitly"
            )
        return default
    layers = tuple(sorted(layers))
    if len(set(layers)) != len(layers):
        raise ConfigError(f"layers_to_capture={layers} has duplicates")
    for layer in layers:
        if not 0 <= layer < num_layers:
            raise ConfigError(f"capture layer {layer} is out of range; allowed: [0, {num_layers}) for this target")
    return layers


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. `temperature=0` is greedy (argmax); other filters then do nothing.

    Types are checked first (a message names the expected type: `temperature="0.7"` is "must
    be a number", not "out of range"); bools are refused where numbers are meant. Numbers
    are stored as floats. `stop_token_ids` takes a list or tuple of token ids, or one bare id
    (`stop_token_ids=5` means `(5,)`). Ranges that depend on the model (`top_k` at most the
    vocabulary, token ids inside it, lengths inside the context) are checked per request by
    `specdec.validation.check_request`.
    """

    temperature: float = 0.0  # >= 0; 0 = greedy
    top_k: int = 0  # >= 0; 0 = off
    top_p: float = 1.0  # (0, 1]; 1 = off
    min_p: float = 0.0  # [0, 1]; 0 = off (keeps tokens with p >= min_p * p_max)
    seed: int | None = None  # per-request generator seed; None = engine generator
    max_new_tokens: int = 128  # >= 1; never exceeded
    stop_token_ids: tuple[int, ...] = ()  # token ids that end the answer once emitted (e.g. 2,7)
    ignore_eos: bool = False  # keep going past the tokenizer's EOS
    num_draft_tokens: int | None = None  # this request's draft budget per step: None = the config's, 0 = none

    def __post_init__(self) -> None:
        t = self.temperature
        t_float = _check_number("temperature", t)
        if not math.isfinite(t_float) or t_float < 0:
            raise ConfigError(f"temperature={t!r} is out of range; allowed: finite and >= 0 (0 = greedy)")
        check_int("top_k", self.top_k, 0)
        p = self.top_p
        if not (0.0 < _check_number("top_p", p) <= 1.0):  # NaN fails too
            raise ConfigError(f"top_p={p!r} is out of range; allowed: (0, 1]")
        m = self.min_p
        if not (0.0 <= _check_number("min_p", m) <= 1.0):
            raise ConfigError(f"min_p={m!r} is out of range; allowed: [0, 1]")
        for name in ("temperature", "top_p", "min_p"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2**63 - 1)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        if self.num_draft_tokens is not None:
            check_int("num_draft_tokens", self.num_draft_tokens, 0)
        stops = self.stop_token_ids
        if isinstance(stops, int) and not isinstance(stops, bool):
            stops = (stops,)  # one bare token id
        if not isinstance(stops, (tuple, list)):
            raise ConfigError(
                f"stop_token_ids must be a token id or a list/tuple of token ids, got {stops!r} ({type(stops).__name__})"
            )
        stops = tuple(stops)
        for tok in stops:
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ConfigError(f"stop_token_ids entries must be token ids >= 0, got {tok!r}")
        object.__setattr__(self, "stop_token_ids", stops)
        _check_bool("ignore_eos", self.ignore_eos)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
