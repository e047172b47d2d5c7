"""Where a step's time goes: draft / verify / rest, per engine, without an extra host sync.

`PhaseTimer` marks the phase boundaries of an *eager* device step: CUDA events on CUDA
(recorded on the step's stream and read only after the token hand-off has synchronized, so
timing adds no wait), the host clock on the CPU (where every op has finished when it
returns). A captured CUDA graph is one replay with no boundaries inside it, so the engine
splits a step only when `SpecEngine.phase_timing` is on, and then runs the step eagerly (the
compiled pieces stay compiled; launch overhead is included in each phase). Without it the
engine still counts every step's total time.

Phases: ``draft`` = the drafter's propose and tree building; ``verify`` = the target's
tree-verify forward; ``rest`` = the step's total minus both (verification, KV relocation,
state advance, the hand-off and the engine's host work of the step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .adaptive import SPECULATIVE

__all__ = ["PHASES", "PhaseTimer", "StepTimes"]

PHASES = ("draft", "verify")  # marked inside the step; "rest" is what remains of the total


class PhaseTimer:
    """Boundaries of one eager step: `start()`, then `mark(phase)` at the end of each phase."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._marks = [("start", self._now())]

    def mark(self, phase: str) -> None:
        self._marks.append((phase, self._now()))

    def read(self) -> dict[str, float]:
        """Seconds of each marked phase; call after the step's work has completed (the hand-off)."""
        out: dict[str, float] = {}
        for (_, a), (phase, b) in zip(self._marks, self._marks[1:]):
            out[phase] = out.get(phase, 0.0) + (a.elapsed_time(b) / 1e3 if self.cuda else b - a)
        return out


# A step's host timeline, in order: the engine's work before the launch (KV reservation, bucket,
# the adaptive choice), the launch call (a graph replay), work beside the device (the adaptive
# rule's fold), the wait for the hand-off (the device's remaining time), the work after it
# (accepted tokens, stops, emitting).
HOST_PARTS = ("before_launch", "launch", "beside_device", "wait", "after_handoff")


@dataclass
class StepTimes:
    """Totals over an engine's steps. `steps` / `seconds`: every step (host time from the
    step's start to its hand-off); `split_steps` and `draft_s` / `verify_s` / `rest_s`: the
    steps that ran with phase timing on (their phases add up to their total)."""

    steps: int = 0
    seconds: float = 0.0
    split_steps: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    rest_s: float = 0.0
    # (batch bucket, variant) -> [steps, seconds, tokens emitted]: where the time went per
    # captured graph, so setups can be compared bucket by bucket (a run's tail of small buckets
    # otherwise blurs a per-step comparison)
    by_bucket: dict = field(default_factory=dict)
    # (batch bucket, variant) -> seconds summed per part of the step's host timeline
    # (`HOST_PARTS`): whether a step that costs more than another with the same device work
    # loses it before the launch, in the launch call, waiting for the device, or after the hand-off
    host_split: dict = field(default_factory=dict)
    # (batch bucket, variant) -> running requests summed over its steps: how full a bucket's
    # steps ran (a bucket-64 step costs the same with 30 requests as with 64)
    running_by_bucket: dict = field(default_factory=dict)
    # overlapped steps whose hand-off was read after a prefill ran (their seconds exclude it; the
    # adaptive rule takes no cost sample from them)
    beside_prefill: int = 0

    def add(self, seconds: float, phases: dict[str, float] | None = None, *, bucket: int | None = None,
            variant: str = SPECULATIVE, tokens: int = 0, host: tuple[float, ...] | None = None,
            running: int = 0, beside_prefill: bool = False) -> None:
        self.steps += 1
        self.beside_prefill += beside_prefill
        self.seconds += seconds
        if bucket is not None:
            row = self.by_bucket.setdefault((bucket, variant), [0, 0.0, 0])
            row[0] += 1
            row[1] += seconds
            row[2] += tokens
            self.running_by_bucket[(bucket, variant)] = self.running_by_bucket.get((bucket, variant), 0) + running
            if host is not None:
                if len(host) != len(HOST_PARTS):
                    raise ValueError(f"host has {len(host)} parts; expected {len(HOST_PARTS)} {HOST_PARTS}")
                split = self.host_split.setdefault((bucket, variant), [0.0] * len(HOST_PARTS))
                for i, part in enumerate(host):
                    split[i] += part
        if phases is not None:
            draft, verify = phases.get("draft", 0.0), phases.get("verify", 0.0)
            self.split_steps += 1
            self.draft_s += draft
            self.verify_s += verify
            self.rest_s += max(0.0, seconds - draft - verify)

    def summary(self) -> str:
        """One line: ms per step, and the split when some steps were timed by phase."""
        if not self.steps:
            return "no steps"
        text = f"{self.steps} steps, {1e3 * self.seconds / self.steps:.2f} ms/step"
        if self.split_steps:
            n = self.split_steps
            text += (f" (phase-timed {n}: draft {1e3 * self.draft_s / n:.2f} ms, verify {1e3 * self.verify_s / n:.2f} ms, "
                     f"rest {1e3 * self.rest_s / n:.2f} ms)")
        return text
