"""Batches of training sequences: seeded, length-bucketed, padded, with loss weights.

Owns the order in which `DistillData` sequences are visited (a seeded shuffle per epoch,
then length bucketing so a batch wastes little padding, under a token budget per batch) and
`TrainBatch`, the padded tensors one training step reads. Loss weights (documented choice):
a response token weighs 1, a prompt token `prompt_weight` (default 0.1: the target's
distribution over its prompt is still the target's behaviour and adds data cheaply, but the
head is judged on responses), the first token 0 (never predicted) and padding 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TrainBatch", "epoch_batches", "collate", "split_validation"]


@dataclass
class TrainBatch:
    """tokens: [B, T] int64 right-padded; weights: [B, T] float32 loss weight of predicting
    token j; response: [B, T] bool token j is a response token; lengths: [B] int64."""

    tokens: torch.Tensor
    weights: torch.Tensor
    response: torch.Tensor
    lengths: torch.Tensor

    def to(self, device) -> "TrainBatch":
        return TrainBatch(*(x.to(device, non_blocking=True) for x in (self.tokens, self.weights, self.response, self.lengths)))

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def epoch_batches(
    lengths: list[int], batch_tokens: int, *, seed: int, epoch: int, max_len: int, pad_multiple: int = 16, bucket: int = 2048
) -> list[list[int]]:
    """Sequence indices of every batch of one epoch (deterministic in seed and epoch).

    A seeded permutation is cut into buckets of `bucket` sequences; each bucket is sorted by
    length and cut into batches with ``B * padded_T <= batch_tokens`` (a longer sequence gets a
    batch of its own); the batches are then shuffled.
    """
    if batch_tokens < 1 or max_len < 2:
        raise ValueError(f"batch_tokens={batch_tokens} must be >= 1 and max_len={max_len} >= 2")
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    batches: list[list[int]] = []
    for start in range(0, len(perm), bucket):
        idx = sorted(perm[start : start + bucket], key=lambda i: (lengths[i], i))
        cur: list[int] = []
        width = 0
        for i in idx:
            L = _round_up(min(lengths[i], max_len), pad_multiple)
            if cur and max(width, L) * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur, width = [], 0
            cur.append(i)
            width = max(width, L)
        if cur:
            batches.append(cur)
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[j] for j in order]


def collate(data, index: list[int], *, max_len: int, prompt_weight: float = 0.1, pad_multiple: int = 16) -> TrainBatch:
    """Pad the sequences `index` of `data` (`DistillData`) into a `TrainBatch` (cut at `max_len`)."""
    seqs = [data.sequence(i)[:max_len] for i in index]
    T = _round_up(max(len(s) for s in seqs), pad_multiple)
    B = len(seqs)
    tokens = torch.zeros(B, T, dtype=torch.int64)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = s
    j = torch.arange(T)[None]  # [1, T]
    prompt = data.prompt_lens[index][:, None]  # [B, 1]
    real = j < lengths[:, None]
    response = real & (j >= prompt)
    weights = torch.where(response, 1.0, torch.where(real & (j >= 1), float(prompt_weight), 0.0)).to(torch.float32)
    return TrainBatch(tokens, weights, response, lengths)


def split_validation(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, validation indices): a seeded `fraction` of the n sequences for validation."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction={fraction} is out of range; allowed: [0, 1)")
    gen = torch.Generator().manual_seed(int(seed) + 77)
    perm = torch.randperm(n, generator=gen).tolist()
    k = int(round(n * fraction))
    return sorted(perm[k:]), sorted(perm[:k])
