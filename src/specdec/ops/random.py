"""Counter-based random draws: uniforms as a pure function of (seed, position, index, stream).

Why: a captured CUDA graph cannot hold per-request `torch.Generator` objects, and a request's
draws must not depend on which other requests share its batch or slot. So every draw is a
hash of its coordinates: the request's seed, the position the step starts at (the root's
committed length, which grows every step, so no two steps of a request share a key), the
index of the draw inside the step (node, lane) and a stream id that separates the users
(verification, the first token after prefill, draft sampling). Same seed, same prompt: same
draws, alone or in any batch, eager or replayed.

The hash is Chris Wellons' `lowbias32` on 32-bit lanes held in int64, with the 32-bit
products split in 16-bit halves so no int64 product overflows (signed overflow is undefined
in the C++ that torch.compile emits). Two 32-bit hashes give the 53 bits of a float64 in
[0, 1). Pure tensor ops: no host sync, fixed shapes, compile- and graph-friendly.
"""

from __future__ import annotations

import torch

__all__ = ["STREAM_VERIFY", "STREAM_FIRST_TOKEN", "STREAM_DRAFT", "counter_uniforms", "hash32"]

STREAM_VERIFY = 1  # verifier coins and bonus draws: [N, 2] per step
STREAM_FIRST_TOKEN = 2  # the token sampled from the prefill logits
STREAM_DRAFT = 3  # draft sampling (sampled trees for verifier="speculative")

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) and a 32-bit constant c, without overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 values in [0, 2^32) -> int64 in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _mix(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return hash32(key ^ (value & _M32))


def counter_uniforms(seed: torch.Tensor, counter: torch.Tensor, num: int, stream: int) -> torch.Tensor:
    """`num` float64 uniforms in [0, 1) per row, a pure function of the coordinates.

    Args:
        seed: [B] int64 >= 0, the request's seed.
        counter: [B] int64 >= 0, where the request is (the root's committed length).
        num: draws per row (static).
        stream: which user draws (`STREAM_*`, static).
    Returns:
        [B, num] float64.
    """
    key = hash32(torch.full_like(seed, stream & _M32))
    key = _mix(key, seed)
    key = _mix(key, seed >> 32)
    key = _mix(key, counter)
    key = _mix(key, counter >> 32)  # [B]
    idx = torch.arange(num, device=seed.device, dtype=torch.int64)[None, :]  # [1, num]
    h1 = _mix(key[:, None], 2 * idx)  # [B, num]
    h2 = _mix(h1, 2 * idx + 1)
    bits = (h1 >> 6) * (1 << 27) + (h2 >> 5)  # 53 bits
    return bits.to(torch.float64) * (2.0**-53)
