"""A project's DVC cache settings as DVC reads them, for the tools that size or probe the cache's disk."""

import configparser
from pathlib import Path

from eagle3.paths import CHECKPOINT_DIR, HIDDEN_DIR, SYNTHETIC_DIR

# Link types DVC can make only within one filesystem; symlink and copy work across filesystems.
SAME_FILESYSTEM_LINKS = ("hardlink", "reflink")
# The outputs whose size the plan's disk figures are about.
LARGE_OUTPUTS = (HIDDEN_DIR, SYNTHETIC_DIR, CHECKPOINT_DIR)


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


def nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def dvc_cache_dir(root: Path) -> Path:
    """The DVC cache as the project's config sets it (a relative cache.dir is relative to .dvc/), else .dvc/cache."""
    configured = cache_option(root, "dir")
    return root / ".dvc" / (configured or "cache")


def usable_cache_link(root: Path, types: list[str]) -> tuple[str, str | None]:
    """The first of `types` (cache.type's order, which DVC tries in turn) that DVC can make between the cache and
    the large outputs as they lie now (through symlinks and mount points), and why earlier ones cannot, if so.
    None of them usable: "copy", the cost DVC's fallback would have."""
    cache_device = nearest_existing(dvc_cache_dir(root).resolve()).stat().st_dev
    apart = [
        out.as_posix()
        for out in LARGE_OUTPUTS
        if nearest_existing((root / out).resolve()).stat().st_dev != cache_device
    ]
    skipped = [kind for kind in types if kind in SAME_FILESYSTEM_LINKS] if apart else []
    usable = next((kind for kind in types if kind not in skipped), "copy")
    if not skipped:
        return usable, None
    return usable, f"{apart[0]} and the DVC cache are on different filesystems, so DVC cannot {' or '.join(skipped)}"
