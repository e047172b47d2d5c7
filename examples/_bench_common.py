"""Shared pieces of the benchmark scripts (`bench_e2e.py`, `bench_cycle.py`); not a benchmark itself.

Owns: progress printing (flushed, so a run cut at its time limit still shows what it
measured), the header line (device, torch, dtype, batch), the markdown table, the JSON-lines
output file (`--out`), device syncs, a per-step wall-clock observer for `SpecDecoder.engine`,
random EAGLE-3 heads built in place on the device, prompt files (`--prompts`:
`read_prompt_file`, `encode_file_prompt`), the implied step cost R (`implied_step_cost`) and
kernels launched per step (`kernels_per_step`, torch.profiler). It knows nothing of which
setups a benchmark runs or how it reports them.
"""

from __future__ import annotations

import gc
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model, init_random_

try:  # the user API (issue 11); older trees export it from specdec.entrypoints.decoder only
    from specdec import SpecDecoder
except ImportError:  # pragma: no cover - depends on the tree's age
    from specdec.entrypoints.decoder import SpecDecoder

__all__ = [
    "FilePrompt",
    "JsonLines",
    "PromptFileError",
    "SpecDecoder",
    "StepTimer",
    "TimedRegion",
    "count_kernels",
    "device_name",
    "encode_file_prompt",
    "fmt",
    "fmt_count",
    "header",
    "implied_step_cost",
    "kernels_per_step",
    "log",
    "markdown_table",
    "random_eagle3_head",
    "read_prompt_file",
    "sync",
    "warm_up",
]


def log(*parts) -> None:
    """Print a progress line now (the run's output goes to a log and may be cut)."""
    print(*parts, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def header(device: torch.device, dtype: torch.dtype, batch: str, **extra) -> str:
    """One line naming what every figure of the table was measured on."""
    parts = [f"device: {device_name(device)}", f"torch {torch.__version__}"]
    try:
        import transformers

        parts.append(f"transformers {transformers.__version__}")
    except ImportError:  # pragma: no cover - transformers is a specdec dependency
        pass
    parts += [f"dtype {str(dtype).removeprefix('torch.')}", f"batch {batch}"]
    parts += [f"{k.replace('_', ' ')} {v}" for k, v in extra.items()]
    return " · ".join(parts)


def fmt(value, spec: str = ".2f", *, suffix: str = "") -> str:
    """A table cell: '-' for a missing or NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec) + suffix


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class JsonLines:
    """Rows appended to `path` as JSON lines as soon as they are measured (None: no file)."""

    def __init__(self, path: str | None, meta: dict):
        self.file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self.write({"kind": "meta", **meta, "argv": sys.argv[1:]})

    def write(self, row: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row, default=str) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def warm_up(dec, prompts: list[list[int]], batch_sizes, device: torch.device, new_tokens: int = 8) -> float:
    """Everything a decoder does once, before anything is timed; returns its seconds.

    `warmup()` compiles and captures the step per batch bucket; then one throw-away request
    per bucket that the timed runs use (up to max(batch_sizes)), and one with the longest
    prompt, pays the first-use costs that the capture does not (Triton's JIT for new prompt
    chunk shapes, cuBLAS handles, allocator growth, the host drafter's first index).
    Without it the first setup of a run was timed cold (SmolLM2 target-only read 115 tok/s
    where a warm run gives 631)."""
    from specdec import SamplingParams

    sync(device)
    t0 = time.perf_counter()
    dec.warmup(progress=False)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    for bucket in dec.config.batch_buckets:
        if bucket <= max(batch_sizes):
            dec.generate([prompts[i % len(prompts)] for i in range(bucket)], params, progress=False)
    dec.generate([max(prompts, key=len)], params, progress=False)
    # each prompt once, prefill only: a new prompt length can meet a new Triton specialization
    # (seen on the H200: ~0.2 s per new length, target-only timed at 233 instead of 526 tok/s)
    dec.generate(list({tuple(p): p for p in prompts}.values()), SamplingParams(max_new_tokens=1), progress=False)
    sync(device)
    return time.perf_counter() - t0



class TimedRegion:
    """The timed part of a benchmark: garbage from warm-up collected, everything alive frozen
    (`gc.freeze`: the cyclic collector never rescans the model, compiled code and graphs),
    and the collector's pauses inside counted (`gc_ms`), so none lands unseen in a timing.

    Why: a full collection over the ~0.5 M objects a compiled decoder leaves took 0.42 s
    in a 0.72 s timed run (2-core CPU, tiny model); on the H200 such pauses made the same
    setup read 25% apart between runs. On exit the objects are unfrozen, so a dropped
    decoder's cycles (its KV cache) are collected again.

        with TimedRegion() as region:
            ...
        region.gc_ms, region.collections
    """

    def __init__(self) -> None:
        self.gc_ms = 0.0
        self.collections = 0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.collections += 1
            self.gc_ms += 1e3 * (time.perf_counter() - self._start)

    def __enter__(self) -> "TimedRegion":
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)
        gc.unfreeze()


class StepTimer:
    """A `SpecEngine` observer: the host wall-clock at every step's hand-off.

    The engine syncs once per step (the token hand-off) before calling `on_step`, so the time
    between consecutive calls is one whole step.
    """

    def __init__(self):
        self.stamps: list[float] = []
        self.accept: list[int] = []

    def on_step(self, engine, accept_length: list[int]) -> None:
        self.stamps.append(time.perf_counter())
        self.accept.append(sum(accept_length))

    def reset(self) -> None:
        self.stamps.clear()
        self.accept.clear()

    def step_ms(self, skip: int) -> tuple[float, int]:
        """(median ms between consecutive steps, intervals used), ignoring the first `skip` intervals."""
        gaps = [(b - a) * 1e3 for a, b in zip(self.stamps, self.stamps[1:])][skip:]
        if not gaps:
            raise RuntimeError(f"{len(self.stamps)} steps recorded: too few to skip {skip} and time the rest")
        return statistics.median(gaps), len(gaps)


def random_eagle3_head(config: Eagle3Config, *, device: torch.device, dtype: torch.dtype, seed: int = 0,
                       std: float = 0.02) -> Eagle3Model:
    """A random EAGLE-3 head (normal(0, std) weights, random draft vocabulary) made on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):  # init_random_ draws with default-device factories
        model = init_random_(Eagle3Model(config), gen, std=std)
    return model.to(dtype).eval().requires_grad_(False)


# ----------------------------------------------------------------------------- R: the implied step cost
def implied_step_cost(tau: float | None, speedup: float | None) -> float | None:
    """R = tau / speedup: what one step of a setup costs, in target-only steps, as its tok/s implies.

    A setup that emits `tau` tokens per target forward and runs `speedup` times target-only's
    tok/s (same run, same batch) spends tau / speedup target-only steps per step (target-only:
    tau 1, speedup 1, R 1.00). None when either is unknown (a transformers row has no tau) or
    the speedup is not positive."""
    if tau is None or speedup is None:
        return None
    tau, speedup = float(tau), float(speedup)
    if math.isnan(tau) or math.isnan(speedup) or speedup <= 0:
        return None
    return tau / speedup


# ----------------------------------------------------------------------------- prompt files (--prompts)
class PromptFileError(ValueError):
    """A prompt file that cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True)
class FilePrompt:
    """One prompt of a prompt file: raw `text` continued as is (no chat template), `text` as one
    user message through the chat template (`chat=True`), or a whole conversation (`messages`,
    through the chat template)."""

    text: str | None = None
    chat: bool = False
    messages: tuple[dict, ...] | None = None

    @property
    def is_chat(self) -> bool:
        return self.chat or self.messages is not None


PROMPT_FILE_FORMATS = """\
FILE.json: a JSON list; FILE.jsonl: one JSON entry per line; any other name: plain text, one
raw prompt per line (blank lines skipped). An entry is a string (raw text, continued without a
chat template, like the built-in code prompts), or an object with one of
  "prompt": a string (raw; add "chat": true to send it as one user message through the chat template),
  "text": a string, with "chat": true/false (the format of specdec's shipped heldout_prompts.jsonl),
  "messages": a list of {"role", "content"} objects (through the chat template, with the
              assistant's generation prompt, like the built-in chat prompts);
other keys are ignored."""


def _entry(item, where: str) -> FilePrompt:
    """One JSON entry as a FilePrompt; raises ValueError naming `where` (the file's name is added by the caller)."""
    if isinstance(item, str):
        if not item.strip():
            raise ValueError(f"{where}: the prompt is an empty string")
        return FilePrompt(text=item)
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a string or an object with \"prompt\", \"text\" or \"messages\", "
                         f"got {type(item).__name__} {str(item)[:60]!r}")
    keys = [k for k in ("prompt", "text", "messages") if k in item]
    if len(keys) != 1:
        what = "none of" if not keys else "more than one of"
        raise ValueError(f"{where}: an object needs exactly one of \"prompt\", \"text\", \"messages\"; it has {what} "
                         f"them (keys: {', '.join(map(repr, item)) or 'none'})")
    chat = item.get("chat", False)
    if not isinstance(chat, bool):
        raise ValueError(f"{where}: \"chat\" must be true or false, got {chat!r}")
    key = keys[0]
    if key == "messages":
        messages = item["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects, "
                             f"got {str(messages)[:60]!r}")
        for j, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"{where}: message {j} must be an object with string \"role\" and \"content\", "
                                 f"got {str(m)[:60]!r}")
        return FilePrompt(messages=tuple(dict(role=m["role"], content=m["content"]) for m in messages))
    text = item[key]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: \"{key}\" must be a non-empty string, got {str(text)[:60]!r}")
    return FilePrompt(text=text, chat=chat)


def read_prompt_file(path) -> list[FilePrompt]:
    """The prompts of a prompt file (`PROMPT_FILE_FORMATS`), in file order.

    Raises `PromptFileError` naming the file and the problem: no such file, not UTF-8 text,
    invalid JSON, not a list, no prompts, or an entry of the wrong type or shape (its index in
    a JSON list, its line in a .jsonl or text file)."""
    path = Path(path)
    name = f"prompt file {str(path)!r}"
    if not path.exists():
        raise PromptFileError(f"{name}: no such file")
    if not path.is_file():
        raise PromptFileError(f"{name}: not a file")
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PromptFileError(f"{name}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise PromptFileError(f"{name}: cannot be read ({err.strerror or err})") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as err:
                raise ValueError(f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
            if not isinstance(data, list):
                raise ValueError(f"expected a JSON list of prompts, got a JSON {type(data).__name__}")
            prompts = [_entry(item, f"entry {i}") for i, item in enumerate(data)]
        elif suffix == ".jsonl":
            prompts = []
            for n, line in enumerate(raw.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"line {n}: not valid JSON ({err.msg}, column {err.colno})") from None
                prompts.append(_entry(item, f"line {n}"))
        else:  # plain text: one raw prompt per line
            prompts = [FilePrompt(text=line) for line in raw.splitlines() if line.strip()]
    except ValueError as err:
        raise PromptFileError(f"{name}: {err}") from None
    if not prompts:
        raise PromptFileError(f"{name}: holds no prompts" + (" (an empty list)" if suffix == ".json" else ""))
    return prompts


def encode_file_prompt(prompt: FilePrompt, tokenizer, vocab_size: int | None = None, *, where: str = "") -> list[int]:
    """Token ids of a `FilePrompt`, as bench_e2e encodes its built-in prompts: raw text through the
    tokenizer (no special tokens), chat prompts through the chat template with the generation
    prompt. Without a tokenizer (tiny random targets) the UTF-8 bytes modulo `vocab_size` (a
    conversation as "role: content" lines). Raises `PromptFileError` (prefixed with `where`)
    for a chat prompt without a chat template or a prompt that encodes to no tokens."""
    messages = list(prompt.messages) if prompt.messages is not None else (
        [{"role": "user", "content": prompt.text}] if prompt.chat else None)
    if tokenizer is None:
        if vocab_size is None:
            raise ValueError("encode_file_prompt without a tokenizer needs vocab_size")
        text = prompt.text if messages is None else "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        ids = [b % vocab_size for b in text.encode("utf-8")]
    else:
        text = prompt.text
        if messages is not None:
            if not getattr(tokenizer, "chat_template", None):
                raise PromptFileError(f"{where}a chat prompt, but the target's tokenizer has no chat template")
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise PromptFileError(f"{where}encodes to no tokens")
    return ids


# ----------------------------------------------------------------------------- kernels per step
def fmt_count(value) -> str:
    """A count cell: '-' when missing, an integer when whole, else one decimal."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def count_kernels(events) -> tuple[int, int]:
    """(device kernels, CUDA-graph launches) among torch.profiler `FunctionEvent`s.

    A kernel: a CUDA-device event whose kineto activity type is "kernel" (torch versions
    without `activity_type`: any CUDA-device event that is no memcpy, memset or sync record).
    A graph launch: a host `cudaGraphLaunch` / `cuGraphLaunch` runtime or driver call."""
    from torch.autograd import DeviceType

    kernels = launches = 0
    for e in events:
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            kernels += _is_kernel(e)
        elif str(getattr(e, "name", "")).startswith(("cudaGraphLaunch", "cuGraphLaunch")):  # CUPTI may add _v10000
            launches += 1
    return kernels, launches


def _is_kernel(event) -> bool:
    """A CUDA-device profiler event is a kernel: its kineto activity type says so, or (torch
    versions without `activity_type`) it is no memcpy, memset or sync record."""
    kind = getattr(event, "activity_type", None)
    if kind:
        return str(kind).lower() == "kernel"
    name = str(getattr(event, "name", ""))
    return not (name.startswith(("Memcpy", "Memset")) or "Sync" in name)


def _profile_steps(engine, requests, steps: int) -> tuple[int, int, int, dict[str, tuple[float, int]]]:
    """Profile up to `steps` `engine.step()` calls, stopping before a step that would run with
    fewer of `requests` (a smaller batch); returns (kernels, graph launches, steps profiled,
    `kernel_times`)."""
    from torch.profiler import ProfilerActivity, profile

    from specdec.engine.request import RUNNING

    done = 0
    torch.cuda.synchronize(engine.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if any(r.status != RUNNING for r in requests):
                break
            engine.step()  # ends in the token hand-off: the step's kernels have run
            done += 1
        torch.cuda.synchronize(engine.device)
    events = prof.events()
    kernels, launches = count_kernels(events)
    return kernels, launches, done, kernel_times(events)


def kernel_times(events) -> dict[str, tuple[float, int]]:
    """Device time (us) and count of each kernel name among torch.profiler `FunctionEvent`s
    (the kernel records `count_kernels` counts)."""
    from torch.autograd import DeviceType

    out: dict[str, tuple[float, int]] = {}
    for e in events:
        if getattr(e, "device_type", None) != DeviceType.CUDA or not _is_kernel(e):
            continue
        name = str(getattr(e, "name", ""))
        us, n = out.get(name, (0.0, 0))
        out[name] = (us + e.time_range.elapsed_us(), n + 1)
    return out


def kernel_table(times: dict[str, tuple[float, int]], steps: int) -> dict[str, list[float]]:
    """Every kernel of a profile (`kernel_times` over `steps` steps): name -> [device ms per step,
    launches per step], the dearest first (JSON-ready: the record beside a kernels/step count)."""
    if steps <= 0:
        raise ValueError(f"steps={steps} must be >= 1")
    return {name: [round(us / 1e3 / steps, 5), round(n / steps, 3)]
            for name, (us, n) in sorted(times.items(), key=lambda kv: -kv[1][0])}


def log_kernel_times(label: str, times: dict[str, tuple[float, int]], steps: int, rows: int = 12) -> None:
    """Log the top kernels of a profile (`kernel_times`): device ms and launches per step."""
    if not times or steps <= 0:
        return
    total = sum(us for us, _ in times.values())
    log(f"KTIME {label}: {total / 1e3 / steps:.3f} ms of kernel time per step, "
        f"{sum(n for _, n in times.values()) / steps:.0f} kernels per step")
    for name, (us, n) in sorted(times.items(), key=lambda kv: -kv[1][0])[:rows]:
        log(f"KTIME   {us / 1e3 / steps:8.3f} ms/step {n / steps:6.1f}/step  {name[:100]}")


def kernels_per_step(decoder, prompts: list[list[int]], *, max_new_tokens: int, steps: int = 4,
                     warm_steps: int = 2, kernel_label: str | None = None,
                     table: dict | None = None) -> tuple[float | None, str]:
    """CUDA kernels launched per steady-state step of `decoder`, batch len(prompts): (count, how).

    Submits `prompts` (greedy, `max_new_tokens` each, EOS ignored), runs the engine until all
    are prefilled and running plus `warm_steps` steps, then profiles up to `steps`
    `engine.step()` calls with torch.profiler (CUPTI) and counts the kernel records per step
    (memcpys, memsets and syncs are not kernels), and logs the top kernels by device time per
    step (`KTIME` lines, `kernel_label` names the row; `table`, when given, receives every
    kernel: name -> [device ms per step, launches per step], for the JSON record beside the
    count, where the top-12 log lines leave the small ones out); the requests are aborted afterwards and the
    decoder is idle again. Its observers see those steps; call it after the timed runs (the
    profiler can leave CUPTI attached, which may slow the CUDA work that follows).

    With CUDA graphs the step is one `cudaGraphLaunch`; CUPTI reports each kernel node of a
    replayed graph as a kernel record, so the graph's kernels are counted (seen on the H200,
    torch 2.11 + CUDA 13.0: a tiny 6-layer target-only step counted 252 kernels replayed and
    246 eagerly; the replayed graph also runs its captured device-to-device copies as driver
    kernels, `memcpy32_post`, and the attention's split combine that its max_seq_len key bound
    needs, which the eager step's tighter bound skips). Should a trace show no more kernel
    records than graph launches (the graph not expanded), the same decoder's step is profiled
    again eagerly (`time_phases(True)`: the same step function, compiled pieces still
    compiled, graphs not replayed) and `how` says so. Not on the CPU: returns (None, reason).
    Never raises: on any failure it logs one line and returns (None, "failed: ...")."""
    engine = decoder.engine
    if engine.device.type != "cuda":
        return None, "not counted on the CPU"
    if steps <= 0:
        return None, "not counted (steps=0)"
    from specdec import SamplingParams
    from specdec.engine.request import RUNNING

    requests = []
    phases = engine.phase_timing
    try:
        params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        requests = [engine.submit(list(p), params) for p in prompts]
        for _ in range(10_000):  # admit and prefill them all (steps of those already running run too)
            if all(r.status == RUNNING for r in requests) or any(r.finished for r in requests):
                break
            engine.run_iteration()
        if not all(r.status == RUNNING for r in requests):
            raise RuntimeError("the requests did not all reach the running state (one ended or failed in prefill)")
        for _ in range(warm_steps):
            engine.step()
        kernels, launches, done, times = _profile_steps(engine, requests, steps)
        how = "graph replay" if launches else "eager step"
        if launches and kernels <= launches:  # the trace did not expand the graph into its kernels
            decoder.time_phases(True)  # the same step, run eagerly (no graph replay)
            for _ in range(warm_steps):
                engine.step()
            kernels, launches, done, times = _profile_steps(engine, requests, steps)
            how = "eager step (the profiler did not show the graph's kernels)"
        if not done:
            raise RuntimeError(f"no step left to profile: max_new_tokens={max_new_tokens} ran out in warm-up")
        log_kernel_times(f"{kernel_label or 'step'} ({how})", times, done)
        if table is not None:
            table.update(kernel_table(times, done))
        return kernels / done, f"{how}, {done} steps"
    except Exception as err:  # a count is a nicety: never cost the benchmark its rows
        first = (str(err).splitlines() or [""])[0][:200]
        log(f"kernels per step: not counted ({type(err).__name__}: {first})")
        return None, f"failed: {type(err).__name__}: {first}"
    finally:
        engine.phase_timing = phases
        for r in requests:
            try:
                engine.abort(r)
            except Exception as err:  # pragma: no cover - abort of a finished request is a no-op
                log(f"kernels per step: abort failed ({type(err).__name__}: {err})")
