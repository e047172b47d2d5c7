"""Typed, validated configuration: what to compose and within which capacities.

Owns `SpecConfig` (the strategy names and the engine's static shape) and its parts, each a
frozen dataclass that checks its own fields:

- `TreeShape`: the draft tree's depth D, width K and size N - 1 (a size left None is derived
  here, once, and derived again by `replace` when D or K change);
- `CacheConfig`: request slots B, context length, paged-KV blocks;
- `ScheduleConfig`: chunked prefill, KV reservation ahead of need, adaptive and overlapped steps;
- `ExecutionConfig`: torch.compile, CUDA graphs and their batch buckets, CPU threads;

plus `SamplingParams` (per-request sampling). Users construct `SpecConfig` flat
(`SpecConfig(drafter="eagle3", topk=8, max_batch_size=4)`): each name goes to its part; code
reads the part (`config.shape.topk`, `config.cache.max_batch_size`), one name per value. Every
rule raises `ConfigError` naming the bad value and the allowed range; nothing is silently
clamped. Strategy *names* are checked against the installed plugins by `specdec.registry`, not
here (third parties add names).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .checks import check_int
from .errors import ConfigError

__all__ = ["CacheConfig", "ConfigError", "ExecutionConfig", "ScheduleConfig", "SpecConfig", "SamplingParams",
           "TreeShape", "resolve_capture_layers"]


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
class TreeShape:
    """The draft tree's shape: depth D, width K, and N - 1 draft tokens (node 0 is the root).

    Which tree policies take `topk` and `max_total_draft_tokens`, and within which range, is the
    policy's to say (`specdec.registry.resolve`); here only the plain bounds.
    """

    max_draft_len: int = 5  # D: draft depth (tokens per chain / tree layers)
    topk: int | None = None  # K: children per expanded node, for policies that branch by K
    max_total_draft_tokens: int | None = None  # draft tokens per step, the tree's size; None = max_draft_len * topk (a chain: max_draft_len)

    def __post_init__(self) -> None:
        check_int("max_draft_len", self.max_draft_len, 1, 64)
        if self.topk is not None:
            check_int("topk", self.topk, 1, 64)
        # whether the size was derived (given as None): `replace` derives it again then, and keeps
        # a value the user chose (an attribute, not a field: flags, equality and repr skip it)
        object.__setattr__(self, "_derived_total", self.max_total_draft_tokens is None)
        if self.max_total_draft_tokens is None:
            object.__setattr__(self, "max_total_draft_tokens", self.max_draft_len * (self.topk or 1))
        check_int("max_total_draft_tokens", self.max_total_draft_tokens, 1, MAX_TREE_SLOTS - 1)

    @property
    def num_tree_slots(self) -> int:
        """N: tree node slots per request, root included."""
        return self.max_total_draft_tokens + 1

    def replace(self, **changes) -> "TreeShape":
        """A validated copy; a derived size is derived again from the new D and K, a chosen one kept."""
        if self._derived_total:
            changes.setdefault("max_total_draft_tokens", None)
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class CacheConfig:
    """Request slots and the paged KV cache they share: static shapes, fixed at start-up."""

    max_batch_size: int = 8  # B: request slots
    max_seq_len: int = 2048  # prompt + generated tokens per request, drafts included
    kv_block_size: int = 16  # tokens per paged-KV block
    num_kv_blocks: int | None = None  # None = enough for every slot at max_seq_len

    def __post_init__(self) -> None:
        check_int("max_batch_size", self.max_batch_size, 1, 4096)
        check_int("max_seq_len", self.max_seq_len, 2, 1 << 20)
        check_int("kv_block_size", self.kv_block_size, 1, 4096)
        if self.num_kv_blocks is not None:
            check_int("num_kv_blocks", self.num_kv_blocks, 1)

    @property
    def blocks_per_seq(self) -> int:
        """Block-table width: blocks that hold `max_seq_len` tokens."""
        return -(-self.max_seq_len // self.kv_block_size)

    @property
    def total_kv_blocks(self) -> int:
        """Paged-KV pool size in blocks."""
        return self.num_kv_blocks or self.max_batch_size * self.blocks_per_seq


@dataclass(frozen=True)
class ScheduleConfig:
    """How the engine runs steps: prefill chunks, KV reserved ahead, when to speculate."""

    prefill_chunk_size: int = 512  # prompt tokens per prefill forward (chunked prefill)
    # prompt tokens an iteration may prefill before its step while requests run (at least one
    # forward): more keeps the batch full when requests finish fast (a speculative decoder),
    # less bounds how long running requests wait for their next token
    prefill_tokens_per_step: int = 2048
    kv_lookahead_steps: int = 4  # KV blocks are reserved this many steps ahead of need
    adaptive: bool = False  # per step, speculate only when the measured cost model says it pays
    overlap: bool = False  # launch each step before reading the last one's hand-off (notes/OVERLAP.md); experimental

    def __post_init__(self) -> None:
        check_int("prefill_chunk_size", self.prefill_chunk_size, 1, 1 << 20)
        check_int("prefill_tokens_per_step", self.prefill_tokens_per_step, 1, 1 << 24)
        check_int("kv_lookahead_steps", self.kv_lookahead_steps, 1, 1024)
        _check_bool("adaptive", self.adaptive)
        _check_bool("overlap", self.overlap)


@dataclass(frozen=True)
class ExecutionConfig:
    """How a step executes on the device: compiled, captured, on how many CPU threads."""

    compile: bool | str = "auto"  # torch.compile the model pieces: "auto" = on for CUDA, off on CPU; "step" = the pieces and the whole step as one graph per bucket
    cuda_graphs: bool | str = "auto"  # capture the step per batch bucket: "auto" = on for CUDA
    graph_batch_sizes: tuple[int, ...] | None = None  # batch buckets; None = 1, 2, 4, ... up to max_batch_size
    threads: int | str = "auto"  # CPU targets: torch threads; "auto" = the cores other work leaves idle (never more than torch's)
    # Inductor's combo kernels for the compiled pieces: a piece's independent small kernels launched as one
    # (a draft depth's input piece: 6 GPU kernels -> 1; `examples/count_launches.py --kernels --combo`).
    # Off until timed on the GPU; CPU code has no combo kernels.
    combo_kernels: bool = False
    # The projections of 1-2 rows with weights of at most 2^22 elements (a small model's batch-1 decode
    # and draft depths) through the Triton few-row kernels (`kernels.small_linear`, every SM on one GEMV;
    # `kernels.fused_linear`, the norm or SwiGLU's activation fused in) instead of cuBLAS, where an H100
    # measured them faster (`small_linear_wins`); CUDA only (the CPU keeps F.linear). Off until the whole
    # step is timed with it (`examples/bench_e2e.py`'s -gemv rows).
    small_linear: bool = False

    def __post_init__(self) -> None:
        for name in ("combo_kernels", "small_linear"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} is not allowed; allowed: True, False")
        for name, words in (("compile", ("auto", "step")), ("cuda_graphs", ("auto",))):
            value = getattr(self, name)
            if not (isinstance(value, bool) or (isinstance(value, str) and value in words)):
                allowed = ", ".join([repr(w) for w in words] + ["True", "False"])
                raise ConfigError(f"{name}={value!r} is not allowed; allowed: {allowed}")
        if self.threads != "auto":
            if isinstance(self.threads, str):
                raise ConfigError(f"threads={self.threads!r} is not allowed; allowed: 'auto' or an int in [1, 1024]")
            check_int("threads", self.threads, 1, 1024)
        if self.graph_batch_sizes is not None:
            sizes = tuple(self.graph_batch_sizes) if isinstance(self.graph_batch_sizes, (tuple, list)) else None
            if not sizes:
                raise ConfigError(
                    f"graph_batch_sizes={self.graph_batch_sizes!r} must be a non-empty tuple of ints or None"
                )
            for b in sizes:
                check_int("graph_batch_sizes entries", b, 1, 4096)
            object.__setattr__(self, "graph_batch_sizes", tuple(sorted(set(sizes))))


PARTS: dict[str, type] = {"shape": TreeShape, "cache": CacheConfig, "schedule": ScheduleConfig,
                          "execution": ExecutionConfig}
# flat name (a part's field) -> the part that owns it
PART_OF: dict[str, str] = {f.name: part for part, cls in PARTS.items() for f in dataclasses.fields(cls)}


def _by_part(settings: dict, whole: dict) -> dict[str, dict]:
    """Flat `settings` grouped by the part that owns each name. An unknown name, or a part that
    `whole` (part name -> a part given whole, or None) also sets, is a `ConfigError`."""
    out: dict[str, dict] = {p: {} for p in PARTS}
    for name, value in settings.items():
        if name not in PART_OF:
            allowed = sorted([f.name for f in dataclasses.fields(SpecConfig)] + list(PART_OF))
            raise ConfigError(f"SpecConfig has no setting {name!r}; allowed: {allowed}")
        out[PART_OF[name]][name] = value
    for part, names in out.items():
        if names and whole.get(part) is not None:
            raise ConfigError(f"{part}= and {sorted(names)} both set the {part} part; pass one or the other")
    return out


@dataclass(frozen=True, init=False)
class SpecConfig:
    """What to compose (strategy names) and the engine's fixed capacities, in parts.

    Capacities are static shapes: B = `cache.max_batch_size` request slots and
    N = `shape.num_tree_slots` tree slots per request (node 0 is the root). Construct it flat,
    every part's field by name (`SpecConfig(drafter="eagle3", topk=8, max_batch_size=4)`), or
    with whole parts (`SpecConfig(cache=CacheConfig(max_batch_size=4))`), not both for one part.
    """

    drafter: str = "none"  # drafting strategy, e.g. "eagle3", "none" (target-only)
    tree: str = "linear"  # tree policy: "linear", "dynamic" (EAGLE-2), "static", "sampled", or a plugin's
    verifier: str = "greedy"  # acceptance rule, e.g. "greedy", "target-only", "speculative"
    layers_to_capture: tuple[int, ...] | None = None  # target layer *outputs*; None = drafter default
    plugin_options: dict = field(default_factory=dict)  # free-form, keyed by plugin name
    shape: TreeShape = field(default_factory=TreeShape, metadata={"part": TreeShape})
    cache: CacheConfig = field(default_factory=CacheConfig, metadata={"part": CacheConfig})
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig, metadata={"part": ScheduleConfig})
    execution: ExecutionConfig = field(default_factory=ExecutionConfig, metadata={"part": ExecutionConfig})

    def __init__(self, *, drafter: str = "none", tree: str = "linear", verifier: str = "greedy",
                 layers_to_capture: tuple[int, ...] | None = None, plugin_options: dict | None = None,
                 shape: TreeShape | None = None, cache: CacheConfig | None = None,
                 schedule: ScheduleConfig | None = None, execution: ExecutionConfig | None = None, **flat) -> None:
        given = {"shape": shape, "cache": cache, "schedule": schedule, "execution": execution}
        per_part = _by_part(flat, given)
        for part, cls in PARTS.items():
            value = given[part]
            if value is None:
                value = cls(**per_part[part])
            elif not isinstance(value, cls):
                raise ConfigError(f"{part} must be a {cls.__name__}, got {value!r} ({type(value).__name__})")
            object.__setattr__(self, part, value)
        object.__setattr__(self, "drafter", drafter)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "verifier", verifier)
        object.__setattr__(self, "layers_to_capture", layers_to_capture)
        object.__setattr__(self, "plugin_options", {} if plugin_options is None else plugin_options)
        self.__post_init__()

    def __post_init__(self) -> None:
        for name in ("drafter", "tree", "verifier"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty strategy name, got {value!r}")
        if not isinstance(self.plugin_options, dict):
            raise ConfigError(
                f"plugin_options must be a dict keyed by plugin name, got {self.plugin_options!r} "
                f"({type(self.plugin_options).__name__})"
            )
        if self.layers_to_capture is not None:
            layers = _int_tuple("layers_to_capture", self.layers_to_capture)
            for layer in layers:
                if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                    raise ConfigError(f"layers_to_capture entries must be ints >= 0, got {layer!r} in {layers}")
            if len(set(layers)) != len(layers):
                raise ConfigError(f"layers_to_capture={layers} has duplicates; each layer may be captured once")
            object.__setattr__(self, "layers_to_capture", tuple(sorted(layers)))
        # rules across parts, once
        sizes, batch = self.execution.graph_batch_sizes, self.cache.max_batch_size
        if sizes is not None:
            for b in sizes:
                check_int("graph_batch_sizes entries", b, 1, batch)
            if sizes[-1] != batch:
                raise ConfigError(
                    f"graph_batch_sizes={sizes} must include max_batch_size={batch} (the bucket that holds every slot)"
                )
        if self.cache.max_seq_len <= self.shape.num_tree_slots:
            raise ConfigError(
                f"max_seq_len={self.cache.max_seq_len} must exceed the tree slots N={self.shape.num_tree_slots} "
                "(max_total_draft_tokens + 1)"
            )

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """Batch sizes a step runs at (and CUDA graphs are captured for), ascending."""
        if self.execution.graph_batch_sizes is not None:
            return self.execution.graph_batch_sizes
        sizes, b, batch = [], 1, self.cache.max_batch_size
        while b < batch:
            sizes.append(b)
            b *= 2
        return tuple(sizes) + (batch,)

    def flat(self) -> dict:
        """Every setting by its flat name (the keywords that rebuild this config)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata.get("part")}
        for part in PARTS:
            value = getattr(self, part)
            out.update({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
        return out

    def replace(self, **changes) -> "SpecConfig":
        """A validated copy with `changes` (flat names, or whole parts) applied. A derived
        `max_total_draft_tokens` (left None) is derived again from the new depth and width; one
        the user chose is kept (and checked against the new shape by the tree policy), never
        silently reset; no other setting changes unless named."""
        fields = {f.name for f in dataclasses.fields(self)}
        kw = {name: changes.get(name, getattr(self, name)) for name in fields}
        per_part = _by_part({k: v for k, v in changes.items() if k not in fields}, changes)
        for part, names in per_part.items():
            if names:
                current = getattr(self, part)
                if isinstance(current, TreeShape):  # a derived size is derived again from the new D and K
                    kw[part] = current.replace(**names)
                else:
                    kw[part] = dataclasses.replace(current, **names)
        return SpecConfig(**kw)


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
