"""One bytecode cache for a run's processes, where Python writes none.

With PYTHONDONTWRITEBYTECODE set (GPU runner images and CI machines often set it), every
process compiles each module it imports that has no bytecode beside it: on an H100 runner
whose image holds none, 1718 modules and 4.4 s of CPU in one test's process, torch's among
them; a GPU job starts 16 xdist workers, a replay child for each and dozens of processes in its
tests. Where pip compiled the packages, fmha's own modules still (an editable install keeps
them in the checkout). The session then shares bytecode among its processes in a cache of its
own (PYTHONPYCACHEPREFIX: nothing is written beside any source), filled before the workers
start with what the session has imported, in parallel over the cores; a module first imported
later is compiled once, by the first process that imports it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

CACHE_ENV = "FMHA_CACHE_DIR"  # as the covering arrays' cache: ~/.cache/fmha, else this
SAVED = "_FMHA_BYTECODE_SAVED"  # what the session changed, to put back at its end


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fmha") / "pycache"


def sources() -> list[str]:
    """The source files of the modules this process has imported."""
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    return sorted(f for f in files if f and f.endswith(".py") and os.path.isfile(f))


def _beside(source: str) -> str:
    prefix, sys.pycache_prefix = sys.pycache_prefix, None
    try:
        return importlib.util.cache_from_source(source)
    finally:
        sys.pycache_prefix = prefix


def share(jobs: int | None = None) -> Path | None:
    """In the session's main process, before any worker starts: where Python writes no bytecode
    and imported modules have none, point this process's children at one cache and fill it with
    those modules. Returns the cache, or None where nothing changes."""
    if not sys.flags.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX") or SAVED in os.environ:
        return None
    everything = sources()
    if all(os.path.exists(_beside(f)) for f in everything):
        return None
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    os.environ[SAVED] = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    # With the cache on, a child reads bytecode from it alone: every imported module goes in,
    # those compiled beside their sources too.
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(everything) // 64 or 1))
    compiling = [subprocess.Popen([sys.executable, "-m", "compileall", "-q", "-i", "-"], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
                 for _ in range(jobs)]
    for n, child in enumerate(compiling):
        child.stdin.write("\n".join(everything[n::jobs]))
        child.stdin.close()
    for child in compiling:
        child.wait()
    return cache


def without_the_cache(environment) -> dict:
    """`environment` as it was before the session shared its cache: for a process that stands
    for another user's (a fresh install's), which would not have it."""
    environment = dict(environment)
    if SAVED in environment:
        saved = environment.pop(SAVED)
        environment.pop("PYTHONPYCACHEPREFIX", None)
        if saved:
            environment["PYTHONDONTWRITEBYTECODE"] = saved
    return environment


def restore() -> None:
    """At the session's end: the environment as it was."""
    if SAVED in os.environ:
        before = without_the_cache(os.environ)
        del os.environ["PYTHONPYCACHEPREFIX"], os.environ[SAVED]
        os.environ.update(before)
