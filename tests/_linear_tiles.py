"""Tiles of the few-row projection kernels (`kernels.small_linear`, `kernels.fused_linear`) for
tests: on the CPU a case runs one SM's tiles, so it is a few interpreted programs (~50 ms each)
and not the hundreds an H100's tiles give (`launch_config` gives each SM about four programs);
on CUDA the device's own tiles. The H100's tiles are built for sm_90 by the compile test."""

from __future__ import annotations

import contextlib

import torch

import specdec.kernels.small_linear as small_linear


@contextlib.contextmanager
def few_programs():
    """Inside: `small_linear._num_sms` is 1 off CUDA (a no-op on CUDA)."""
    if torch.cuda.is_available():
        yield
        return
    before = small_linear._num_sms
    small_linear._num_sms = lambda device: 1
    try:
        yield
    finally:
        small_linear._num_sms = before
