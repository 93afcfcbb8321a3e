"""`eagle3 plan`'s links: how DVC links outputs to its cache on this project (copies count twice on disk), the
link from here to the rented machine and to the DVC remote (as given, or an upload to the remote measured), and
this machine's sha256 speed (what hashing the outputs costs). Each with its source, for `Inputs.sources`;
eagle3/plan/inputs.py gathers them with the other inputs.
"""

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.plan.facts import CACHE_LINKS
from eagle3.remotes.dvc_settings import cache_option, usable_cache_link


def sha256_bytes_per_s() -> float:
    """sha256 over 64 MiB in memory on one thread of this machine, the fastest of three passes."""
    import hashlib
    import time

    data = bytes(64 << 20)
    fastest = math.inf
    for _ in range(3):
        started = time.perf_counter()
        hashlib.sha256(data).digest()
        fastest = min(fastest, time.perf_counter() - started)
    return len(data) / fastest


@dataclass(frozen=True)
class CacheLink:
    link: str
    source: str
    # no usable cache.type in the project's DVC config, so DVC's default (which copies on ext4) would apply
    assumed: bool


def check_cache_link(args: argparse.Namespace, root: Path) -> CacheLink:
    """--cache-link, else what DVC will make of this project's cache.type where its outputs lie now (a hardlink
    cannot reach an output on another filesystem than the cache), else the hardlink docs/remotes.md sets up."""
    if args.cache_link is not None:
        return CacheLink(args.cache_link, "--cache-link", assumed=False)
    configured = cache_option(root, "type")
    types = [kind.strip() for kind in (configured or "").split(",") if kind.strip() in CACHE_LINKS]
    if types:
        link, why = usable_cache_link(root, types)
        source = f"this project's DVC config (cache.type {configured})" + (f": {why}" if why else "")
        return CacheLink(link, source, assumed=False)
    return CacheLink("hardlink", "assumed: docs/remotes.md's `cache.type hardlink,symlink`", assumed=True)


@dataclass(frozen=True)
class Link:
    gbit: float
    efficiency: float
    measurement: dict[str, Any] | None
    source: str


REMOTE_DOWN_ASSUMED = (
    "the rented machine's speed to the DVC remote is assumed to be the link's: it prices A's `dvc pull` of the hidden "
    "states, and so A against B; give --remote-down-gbit (the provider's figure, or a `dvc pull` timed on a machine "
    "of that provider)"
)


def remote_speeds(args: argparse.Namespace, link: "Link") -> tuple[tuple[float, str], tuple[float, str]]:
    """(Gbit/s, source) here -> the DVC remote and the rented machine <-> it: each as given, else the link as
    reached (its measurement to a remote, for the upload, where --link-from-remote made one)."""
    reached = link.gbit * link.efficiency
    up = (
        (args.remote_up_gbit, "--remote-up-gbit")
        if args.remote_up_gbit is not None
        else (reached, link.source if args.link_from_remote else "assumed: the link")
    )
    down = (
        (args.remote_down_gbit, "--remote-down-gbit")
        if args.remote_down_gbit is not None
        else (reached, "assumed: the link (--remote-down-gbit)")
    )
    return up, down


def probe_link(args: argparse.Namespace, root: Path) -> Link:
    """--link-gbit x --link-efficiency, or with --link-from-remote an upload to that remote, measured."""
    if not args.link_from_remote:
        given = "" if args.link_gbit_given else " (default)"
        efficiency = "" if args.link_efficiency_given else " (default)"
        return Link(
            args.link_gbit,
            args.link_efficiency,
            None,
            f"--link-gbit {args.link_gbit:g}{given} x --link-efficiency {args.link_efficiency:g}{efficiency}",
        )
    from eagle3.remotes.probe import measure_upload

    measurement = measure_upload(root, args.link_from_remote, int(args.probe_mb * 1e6), args.jobs)
    return Link(
        measurement["parallel_gbit"],
        1.0,
        measurement,
        f"measured: {args.probe_mb:g} MB to DVC remote {args.link_from_remote!r}, one stream "
        f"{measurement['single_gbit']:.3g} Gbit/s, {measurement['jobs']} streams {measurement['parallel_gbit']:.3g}"
        " Gbit/s (used: `dvc push --jobs` runs as many)",
    )
