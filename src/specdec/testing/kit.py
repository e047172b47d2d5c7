"""The conformance kit's machinery: properties, the subjects they check, and how many
hypothesis examples each gets per profile.

A `Property` is a named check of one kind of strategy ("tree-builder", "verifier",
"tree-policy", "relocator", "drafter"): ``run(subject, ctx)`` raises AssertionError (with
hypothesis' falsifying example) when the strategy breaks it. Example counts are per
property and per profile (`ci`: derandomized, CPU-sized; `gpu`: many examples), scaled to
the property's cost, so `specdec check --profile gpu` stays within minutes.

This module imports no check module: they import it (to `register`), and `suite` imports
them all and picks a subject's properties (`suite.properties_for`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, Phase, settings

from .profiles import PROFILES

__all__ = ["Context", "Subject", "Property", "Result", "PROFILES", "register", "run_property", "references_on_cpu"]


@dataclass(frozen=True)
class Context:
    """Where and how hard to check: the device, the profile, an example multiplier, and whether
    a failure is shrunk to a minimal example (slower, clearer) or reported as first found."""

    device: torch.device = torch.device("cpu")
    profile: str = "ci"
    scale: float = 1.0
    shrink: bool = True

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile={self.profile!r} is unknown; allowed: {list(PROFILES)}")

    @property
    def full(self) -> bool:
        """Full-size cases (the GPU profile, or a CUDA device: kernels are not interpreted)."""
        return self.profile == "gpu" or self.device.type == "cuda"

    def settings_for(self, fn) -> settings:
        """The settings of the registered property whose `run` is `fn`."""
        return self.settings(next(p for p in _REGISTRY if p.run is fn))

    def settings(self, prop: "Property") -> settings:
        n = prop.gpu if self.profile == "gpu" else prop.ci
        phases = {} if self.shrink else dict(phases=[Phase.explicit, Phase.reuse, Phase.generate])
        return settings(
            **phases,
            max_examples=max(1, round(n * self.scale)),
            derandomize=self.profile == "ci",
            database=None,
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        )


@contextlib.contextmanager
def references_on_cpu(device):
    """On CPU, the ops' torch references instead of interpreted Triton kernels, for checks that
    run many rows (distribution tests, end-to-end decoding): interpreted, one Triton program
    per row is ~1000x slower. Kernel and reference are compared with each other elsewhere."""
    before = os.environ.get("TRITON_INTERPRET")
    if torch.device(device).type == "cpu":
        os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


@dataclass
class Subject:
    """One strategy under check: its name, kind, the resolved object (None for policies and
    drafters, which are resolved per example from a config), its capabilities, the plugin
    manager, and the base config / plugin options the user gave."""

    name: str
    kind: str
    obj: object = None
    caps: object = None
    pm: object = None
    config: dict = field(default_factory=dict)  # SpecConfig fields
    options: dict = field(default_factory=dict)  # plugin_options


@dataclass(frozen=True)
class Property:
    """A named check. `ci` / `gpu`: hypothesis examples per profile; `applies(subject)`:
    whether it concerns this subject (e.g. distribution tests only for lossless sampling
    verifiers)."""

    name: str
    kind: str
    run: Callable[[Subject, Context], None]
    ci: int
    gpu: int
    applies: Callable[[Subject], bool] = lambda subject: True


@dataclass
class Result:
    subject: str
    kind: str
    prop: str
    examples: int
    seconds: float
    ok: bool
    error: str = ""


_REGISTRY: list[Property] = []  # filled as the check modules are imported (`suite` imports them all)


def register(kind: str, name: str, *, ci: int, gpu: int, applies=None):
    """Decorator: register ``fn(subject, ctx)`` as the property `name` of strategies of `kind`."""

    def wrap(fn):
        _REGISTRY.append(Property(name, kind, fn, ci, gpu, applies or (lambda subject: True)))
        return fn

    return wrap


def run_property(prop: Property, subject: Subject, ctx: Context) -> Result:
    """Run one property; never raises for a failed check (the Result says so)."""
    t0 = time.perf_counter()
    n = ctx.settings(prop).max_examples
    try:
        prop.run(subject, ctx)
        return Result(subject.name, subject.kind, prop.name, n, time.perf_counter() - t0, True)
    except Exception as err:  # a failed property, or a strategy that crashed on valid input
        return Result(subject.name, subject.kind, prop.name, n, time.perf_counter() - t0, False, _first_line(err))


def _first_line(err: BaseException) -> str:
    """`Type: first line` of the error; for hypothesis' group of distinct failures, of the first one."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    first = f"{type(err).__name__}: {err}".strip().splitlines()
    return first[0] if first else type(err).__name__
