"""drafter="eagle3" (placeholder until issue 5 lands; the helper writing issue 5 replaces this file)."""

from specdec.hookspecs import hookimpl


@hookimpl
def specdec_strategy_names():
    return {"drafter": ["eagle3"]}


@hookimpl
def specdec_draft(config, target):
    if config.drafter == "eagle3":
        raise NotImplementedError("drafter='eagle3' waits for issue 5 (EAGLE-3 end to end)")
    return None
