"""Random draft trees and naive oracles for the tree-op suites: the conformance kit's own
(`specdec.testing.strategies` / `oracles`, shipped for plugin authors), re-exported under the
names these tests use, plus the CPU/GPU sizing of kernel cases.

Sizes read the hypothesis profile: under `gpu` the Triton kernels see the full ranges
(bs 1..8, N 1..256); under `ci` (CPU, Triton interpreter) kernel cases stay small.
"""

from __future__ import annotations

import os

import torch
from hypothesis import settings

from specdec.testing.oracles import ancestors_or_self, children_lists, naive_greedy_walk, unpack_mask  # noqa: F401
from specdec.testing.strategies import BOUNDARY_SIZES, SHAPES  # noqa: F401
from specdec.testing.strategies import Forest as Trees  # noqa: F401
from specdec.testing.strategies import forests as trees  # noqa: F401
from specdec.testing.strategies import make_forest as make_trees  # noqa: F401

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")  # (a module constant: hypothesis forbids function fixtures)
FULL = PROFILE == "gpu" or ON_GPU  # the interpreter is too slow for full-size kernel cases


def ci_examples(count: int, gpu: int | None = None) -> settings:
    """Settings for a test whose examples are slow: `count` examples on CPU (interpreted
    kernels); on a CUDA machine the profile's number, capped at `gpu`."""
    profile = settings.default.max_examples
    return settings(max_examples=min(profile, gpu or profile) if FULL else count)


def kernel_sizes(full: tuple[int, int], small: tuple[int, int]) -> tuple[int, int]:
    """(max_batch, max_slots) for cases that run a kernel: `full` on GPU, `small` interpreted."""
    return full if FULL else small
