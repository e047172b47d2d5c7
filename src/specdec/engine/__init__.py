"""The engine: host work around one device step, for many requests at once.

    scheduler.py   queue, admission order, prefill groups, preemption victims (plain Python)
    engine.py      `SpecEngine`: the iteration, the launch, the one hand-off, emitting tokens
    prefill.py     chunked, grouped prefill of target and drafter; first tokens
    kv_blocks.py   backing running requests with KV blocks ahead of need; preemption
    graphs.py      warm-up, CUDA-graph capture per batch bucket, step timing
    step.py        `DeviceStep`: the step itself, one device function over the `StepState`
    adaptive.py    the adaptive rule: speculate or run a plain step, by measured cost
    step_timing.py step times per bucket and phase
    request.py     `RequestState`; watchdog.py: requests that stop progressing fail
    protocols.py   what the engine asks of a target runner and of step observers

The public names are imported on first use (PEP 562), so importing a submodule (the
scheduler, the request record) does not load the engine and torch with it.
"""

from importlib import import_module

_LAZY = {  # public name -> the submodule that defines it
    "SpecEngine": ".engine",
    "WarmupReport": ".graphs",
    "use_prefill_buckets": ".prefill",
    "RequestState": ".request",
    "StepObserver": ".protocols",
    "TargetRunner": ".protocols",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specdec.engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
