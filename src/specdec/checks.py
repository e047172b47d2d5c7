"""Shared validators for integer arguments and request slots, one rule each.

Each raises the error type its caller names (`ConfigError` by default), so a config, the
KV cache and a drafter keep their own error types while the rule and its message are written
once.
"""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["check_int", "check_slot"]


def check_int(name: str, value, lo: int, hi: int | None = None, *, error: type[Exception] = ConfigError,
              note: str = "") -> int:
    """`value`, if it is an int (never a bool) in [lo, hi] (hi None: no upper bound); else `error`
    naming the value and the allowed range, followed by `note`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise error(f"{name}={value} is out of range; allowed: {rng}{note}")
    return value


def check_slot(slot, num_slots: int, *, error: type[Exception] = ValueError) -> int:
    """`slot`, if it is an int (never a bool) in [0, num_slots); else `error`."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < num_slots:
        raise error(f"slot={slot!r} is out of range; allowed: [0, {num_slots})")
    return slot
