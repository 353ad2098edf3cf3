"""Declarative op specs (data only); shipped inside refcore as ``refcore.specs``."""
