"""The GPU's SM clock and power draw during a timed region, sampled by `nvidia-smi` every 100 ms.

Why: a benchmark that runs setups one after another on one GPU compares them only if the GPU
ran them at the same clock. A compute-bound phase (a batch-64 prompt prefill of the 8B shape)
slows with the SM clock when the board holds its power cap, and a heavy setup run before can
leave it there; the samples say whether two rows ran at the same clock. Not a benchmark itself;
nothing here touches the device from Python.

    with GpuClocks() as clocks:
        ...timed work...
    clocks.summary()  # {'sm_mhz_median': ..., 'sm_mhz_min': ..., 'power_w_median': ..., 'power_w_max': ..., 'samples': n} or None
"""

from __future__ import annotations

import shutil
import statistics
import subprocess

__all__ = ["GpuClocks", "parse_samples"]

QUERY = "clocks.sm,power.draw"
PERIOD_MS = 100


def parse_samples(text: str) -> list[tuple[float, float]]:
    """(SM clock MHz, power W) per line of `nvidia-smi --query-gpu=clocks.sm,power.draw
    --format=csv,noheader,nounits` output; lines that are not two numbers are skipped (a
    sample cut when the sampler stops, '[N/A]')."""
    samples = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2:
            continue
        try:
            samples.append((float(fields[0]), float(fields[1])))
        except ValueError:
            continue
    return samples


class GpuClocks:
    """Samples GPU `index` (default 0) while the block runs; inert without `nvidia-smi`."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self._proc: subprocess.Popen | None = None
        self.samples: list[tuple[float, float]] = []

    def __enter__(self) -> "GpuClocks":
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self._proc = subprocess.Popen(
                [exe, f"--id={self.index}", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"-lms={PERIOD_MS}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        self.samples = parse_samples(out or "")
        self._proc = None

    def summary(self) -> dict | None:
        """Median and lowest SM clock, median and highest power over the samples; None without any."""
        if not self.samples:
            return None
        clocks = [c for c, _ in self.samples]
        power = [p for _, p in self.samples]
        return dict(sm_mhz_median=statistics.median(clocks), sm_mhz_min=min(clocks),
                    power_w_median=statistics.median(power), power_w_max=max(power), samples=len(self.samples))
