"""Plugin helpers: a strategy's hook guarded by its name, and its names declared from its hooks.

A strategy hook answers only when the config names the strategy (pluggy asks every plugin;
the others must return None). `strategy_hook(NAME)` writes that guard once, reading the kind
off the hook's name, and `declared_names(...)` builds the plugin's `specdec_strategy_names`
from the hooks so guarded, so a name is written once per plugin:

    @strategy_hook("top2")
    def specdec_verify(config):
        return Top2Verifier()

    specdec_strategy_names = declared_names(specdec_verify)

Plain `@hookimpl` functions stay valid; these only remove the repeated parts.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from .hookspecs import hookimpl

__all__ = ["GUARDED_HOOKS", "declared_names", "strategy_hook"]

# hook name -> the SpecConfig field that names the strategy answering it
GUARDED_HOOKS = {
    "specdec_draft": "drafter",
    "specdec_capture_layers": "drafter",
    "specdec_tree_policy": "tree",
    "specdec_verify": "verifier",
}


def strategy_hook(*names: str, **hookimpl_options) -> Callable[[Callable], Callable]:
    """Decorate a hook function named like a strategy hook (`GUARDED_HOOKS`) so that it runs
    only when the config's field for that kind is one of `names`, and returns None otherwise;
    the result is a `hookimpl` (`hookimpl_options` such as `tryfirst` pass through) with the
    function's own signature, which must start with `config`."""
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"strategy_hook needs one or more non-empty strategy names, got {names!r}")

    def decorate(fn: Callable) -> Callable:
        kind = GUARDED_HOOKS.get(fn.__name__)
        if kind is None:
            raise TypeError(f"strategy_hook cannot guard {fn.__name__!r}; allowed: functions named {sorted(GUARDED_HOOKS)}")
        params = list(inspect.signature(fn).parameters)
        if not params or params[0] != "config":
            raise TypeError(f"{fn.__name__} must take `config` as its first argument, got ({', '.join(params)})")

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            config = args[0] if args else kwargs["config"]
            return fn(*args, **kwargs) if getattr(config, kind) in names else None

        guarded.specdec_strategy = (kind, names)
        return hookimpl(**hookimpl_options)(guarded)

    return decorate


def declared_names(*hooks: Callable) -> Callable[[], dict[str, list[str]]]:
    """A `specdec_strategy_names` hookimpl that declares the names `hooks` (made by
    `strategy_hook`) answer to, by kind, in order."""
    declared: dict[str, list[str]] = {}
    for hook in hooks:
        kind_names = getattr(hook, "specdec_strategy", None)
        if kind_names is None:
            raise TypeError(f"declared_names takes hooks made by strategy_hook, got {getattr(hook, '__name__', hook)!r}")
        kind, names = kind_names
        declared.setdefault(kind, [])
        declared[kind] += [n for n in names if n not in declared[kind]]

    def specdec_strategy_names() -> dict[str, list[str]]:
        return {kind: list(kind_names) for kind, kind_names in declared.items()}

    return hookimpl(specdec_strategy_names)
