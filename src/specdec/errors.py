"""`ConfigError`, in a module of its own so that code which only raises it need not import
the configs (`specdec.config` re-exports it)."""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value is outside its allowed range."""
