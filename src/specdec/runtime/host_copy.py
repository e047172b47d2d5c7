"""Host values onto the device without a stream sync.

Why: `torch.tensor(values, device="cuda")` (and `cuda_tensor.copy_(cpu_tensor)`) copies from
pageable memory, which PyTorch follows with a stream synchronize: the host waits until every
queued kernel has run before it can queue the next. The prefill path made ~15 such copies per
prompt on the H200 (token ids, slots, lengths, each request's next token), so the host could
never run ahead of the device between prompt forwards. Staged in pinned memory, the copy is
asynchronous; the pinned-memory cache keeps the staging buffer alive until its copy is done.
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(values, device: torch.device | str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`values` (a list, nested lists, or a CPU tensor) as a tensor on `device`: on CUDA an
    asynchronous copy from pinned memory, elsewhere the host tensor itself."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
