"""specdec_relocate_kv (placeholder until issue 4 lands; the helper writing issue 4 replaces this file)."""

from specdec.hookspecs import hookimpl


@hookimpl
def specdec_relocate_kv(config):
    raise NotImplementedError("specdec_relocate_kv waits for issue 4")
