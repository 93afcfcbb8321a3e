"""A project's DVC cache settings as DVC reads them, for the tools that size or probe the cache's disk."""

import configparser
from pathlib import Path


def cache_option(root: Path, key: str) -> str | None:
    """`cache.<key>` of the project's DVC config, config.local overriding config, unquoted; None where neither sets
    it (or neither parses)."""
    value = None
    for name in ("config", "config.local"):
        parser = configparser.ConfigParser()
        try:
            parser.read(root / ".dvc" / name)
        except configparser.Error:
            continue
        if parser.has_option("cache", key):
            value = parser.get("cache", key).strip().strip("'\"")
    return value
