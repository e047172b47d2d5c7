"""Tensor parallelism's process group and collectives, through torch.distributed.

Owns `TPGroup` (the record of one tensor-parallel group: size, this process's rank in it,
the c10d group and its backend), `tensor_parallel_group` (joins the job's process group,
or starts it from torchrun's environment, and checks it against `tp_size` before anything
loads) and the two collectives the sharded layers call: `all_reduce` (sum, in place) and
`all_gather_last` (concatenate along the last dimension). It knows nothing of models: the
sharded layers and which slice of each weight a rank holds live in `models/parallel.py`.

Backends: NCCL for CUDA targets, gloo for CPU targets (what the tests spawn). NCCL always
runs with NVLink multicast (NVLS) off: `NCCL_NVLS_ENABLE=0` is set in the environment
before the process group (and so its communicators) is created; a job that sets it to
anything else is refused. Both collectives are plain c10d calls on fixed-shape tensors, so
a CUDA graph captures them (NCCL collectives are graph-capturable; c10d skips its watchdog
bookkeeping for captured work) and every replay runs the same all-reduces. The first
NCCL collective is issued here, at set-up, so no communicator is created inside a capture.

Every rank of a group runs the same engine on the same requests (SPMD); any decision a
rank takes from its own clock (adaptive speculation) would desynchronize the collectives,
so the decoder refuses those with `tp_size > 1`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .errors import ConfigError

__all__ = ["SINGLE", "TPGroup", "all_gather_last", "all_reduce", "check_spmd", "check_tp_size", "tensor_parallel_group"]

NVLS_ENV = "NCCL_NVLS_ENABLE"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_GROUPS: dict[int, object] = {}  # tp_size -> this rank's c10d group (new_group is collective: made once)


@dataclass(frozen=True)
class TPGroup:
    """One tensor-parallel group: `size` ranks, of which this process is `rank`.

    `group` is the c10d `ProcessGroup` (None for size 1: no collective ever runs) and
    `backend` its name ("nccl", "gloo"). Ranks of a group hold different shards of the target
    and identical copies of everything else.
    """

    size: int = 1
    rank: int = 0
    group: object | None = None
    backend: str | None = None

    @property
    def is_first(self) -> bool:
        """True on the rank that reports (rank 0 of the group)."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(x, self)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(x, self)

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)


SINGLE = TPGroup()  # tp_size 1: today's single-device behaviour, no process group needed


def all_reduce(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Sum `x` over the group's ranks, in place; returns `x` (identity for size 1).

    Every rank gets the same bits (one reduction result, broadcast), which is what lets the
    layers after it, the verifier and the token hand-off run identically on every rank.
    """
    if tp.size == 1:
        return x
    import torch.distributed as dist

    dist.all_reduce(x, group=tp.group)
    return x


def all_gather_last(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """[..., n] on every rank -> [..., size * n], rank r's block at columns [r*n, (r+1)*n).

    One `all_gather_into_tensor` over the flattened rows (rank-major), then one copy into
    the column layout. Identity for size 1.
    """
    if tp.size == 1:
        return x
    import torch.distributed as dist

    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()  # [R, n]
    out = torch.empty((tp.size * rows.shape[0], n), dtype=x.dtype, device=x.device)  # [size * R, n], rank-major
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 renamed it
    gather(out, rows, group=tp.group)
    out = out.view(tp.size, rows.shape[0], n)  # [size, R, n]
    return out.permute(1, 0, 2).reshape(*x.shape[:-1], tp.size * n)  # [..., size * n]


def check_tp_size(tp_size) -> int:
    """`tp_size` if it is an int >= 1; else a `ConfigError` naming it."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(f"tp_size must be an int >= 1, got {tp_size!r}")
    return tp_size


def check_spmd(config, tp_size: int) -> None:
    """`SpecConfig` options whose decisions come from each rank's own clock cannot run with
    `tp_size > 1` (the ranks would choose differently and their collectives desynchronize)."""
    if tp_size > 1 and config.schedule.adaptive:
        raise ConfigError(
            f"adaptive=True cannot run with tp_size={tp_size}: each rank would time its own steps and could choose "
            "a different step, desynchronizing the ranks' collectives; use adaptive=False"
        )


def _set_nvls_off() -> None:
    value = os.environ.get(NVLS_ENV)
    if value not in (None, "0"):
        raise ConfigError(
            f"{NVLS_ENV}={value!r}: specdec runs NCCL with NVLink multicast off; unset it or export {NVLS_ENV}=0"
        )
    os.environ[NVLS_ENV] = "0"


def tensor_parallel_group(tp_size: int, device: torch.device) -> tuple[TPGroup, torch.device]:
    """The tensor-parallel group of this process for `tp_size`, and the device its shard goes on.

    `tp_size` 1 needs no process group (returns `SINGLE`, `device`). Otherwise the job's
    default process group is used; when none exists but torchrun's environment is there
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) it is created here (NCCL for CUDA, gloo for
    the CPU), after setting `NCCL_NVLS_ENABLE=0`. The world splits into groups of `tp_size`
    consecutive ranks (world_size / tp_size replicas, each running its own engine). A CUDA
    `device` without an index becomes `cuda:LOCAL_RANK` (else rank % device count).

    Raises:
        ConfigError: a bad `tp_size`, no process group, `tp_size` larger than (or not dividing)
            the world size, a backend that cannot move `device`'s tensors, NVLS asked for.
    """
    tp_size = check_tp_size(tp_size)
    if tp_size == 1:
        return SINGLE, device
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError(f"tp_size={tp_size} needs torch.distributed, which this torch build lacks")
    _set_nvls_off()  # before any NCCL communicator exists
    if not dist.is_initialized():
        if not all(k in os.environ for k in _TORCHRUN_ENV):
            raise ConfigError(
                f"tp_size={tp_size} needs a torch.distributed job and none is running: launch with "
                f"`torchrun --nproc-per-node {tp_size} ...`, or call torch.distributed.init_process_group "
                "('nccl' on CUDA, 'gloo' on the CPU) in every process first"
            )
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        if device.type == "cuda":
            device = torch.device("cuda", local if device.index is None else device.index)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if tp_size > world:
        raise ConfigError(f"tp_size={tp_size} is larger than the job's world size {world}; allowed: 1 .. {world}")
    if world % tp_size:
        allowed = [d for d in range(1, world + 1) if world % d == 0]
        raise ConfigError(f"tp_size={tp_size} does not divide the world size {world}; allowed: {allowed}")
    backend = str(dist.get_backend())
    need = "nccl" if device.type == "cuda" else "gloo"
    if need not in backend:
        raise ConfigError(
            f"a {device.type} target with tp_size={tp_size} needs the {need!r} backend; the process group runs "
            f"{backend!r} (init_process_group('{need}'))"
        )
    if device.type == "cuda" and device.index is None:
        local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        device = torch.device("cuda", local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = _GROUPS.get(tp_size)
    if group is None:
        if tp_size == world:
            group = dist.group.WORLD
        else:  # every rank makes every group, in the same order (new_group is collective)
            for start in range(0, world, tp_size):
                g = dist.new_group(list(range(start, start + tp_size)))
                if start <= rank < start + tp_size:
                    group = g
        _GROUPS[tp_size] = group
    tp = TPGroup(size=tp_size, rank=rank % tp_size, group=group, backend=need)
    probe = torch.ones(1, device=device)
    all_reduce(probe, tp)  # creates the NCCL communicator now, never inside a graph capture
    if int(probe.item()) != tp_size:
        raise ConfigError(f"the tensor-parallel group's all-reduce summed {probe.item()} over {tp_size} ranks")
    return tp, device
