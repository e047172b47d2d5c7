"""verifier="speculative" (placeholder until issue 3 lands; the helper writing issue 3 replaces this file)."""

from specdec.hookspecs import hookimpl


@hookimpl
def specdec_strategy_names():
    return {"verifier": ["speculative"]}


@hookimpl
def specdec_verify(config):
    if config.verifier == "speculative":
        raise NotImplementedError("verifier='speculative' waits for issue 3 (tree ops)")
    return None
