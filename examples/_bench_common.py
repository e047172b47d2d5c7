"""Shared pieces of the benchmark scripts (`bench_e2e.py`, `bench_cycle.py`); not a benchmark itself.

Owns: progress printing (flushed, so a run cut at its time limit still shows what it
measured), the header line (device, torch, dtype, batch), the markdown table, the JSON-lines
output file (`--out`), device syncs, a per-step wall-clock observer for `SpecDecoder.engine`,
and random EAGLE-3 heads built in place on the device. It knows nothing of which setups a
benchmark runs or how it reports them.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model, init_random_

try:  # the user API (issue 11); older trees export it from specdec.decoder only
    from specdec import SpecDecoder
except ImportError:  # pragma: no cover - depends on the tree's age
    from specdec.decoder import SpecDecoder

__all__ = [
    "JsonLines",
    "SpecDecoder",
    "StepTimer",
    "device_name",
    "fmt",
    "header",
    "log",
    "markdown_table",
    "random_eagle3_head",
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
