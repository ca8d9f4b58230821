"""How many Triton (and Gluon) kernels a CUDA session compiled, and the seconds it spent, from
Triton's own compilation listener (`triton.knobs.compilation.listener`), in the terminal
summary:

    fmha: Triton compiled 41 kernels in 96.3 s (12 more loaded from its cache); _attention_fwd 35 (88.0 s), ...

A compile is a miss of Triton's on-disk cache (TRITON_CACHE_DIR, default ~/.triton/cache); a
load is a hit there (a kernel this process had not used yet). Under xdist each worker counts
its own and the controller adds them up; a worker that crashed takes its counts with it.
"""

from __future__ import annotations

import collections

import pytest

WORKER_KEY = "fmha_compile_stats"


class CompileStats:
    def __init__(self):
        # kernel name -> [compiles, compile seconds, cache loads]
        self.by_kernel: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0])
        self.workers_reported = 0
        self._previous = None

    def install(self) -> None:
        import triton

        self._previous = triton.knobs.compilation.listener
        triton.knobs.compilation.listener = self._listen

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit):
        entry = self.by_kernel[_label(src)]
        if cache_hit:
            entry[2] += 1
        else:
            entry[0] += 1
            entry[1] += (times.ir_initialization + sum(us for _, us in times.lowering_stages)
                         + times.store_results) / 1e6
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    def add(self, counts: dict) -> None:
        for name, (compiles, seconds, loads) in counts.items():
            entry = self.by_kernel[name]
            entry[0] += compiles
            entry[1] += seconds
            entry[2] += loads

    def summary(self) -> str:
        compiles = sum(e[0] for e in self.by_kernel.values())
        seconds = sum(e[1] for e in self.by_kernel.values())
        loads = sum(e[2] for e in self.by_kernel.values())
        kernels = ", ".join(f"{name} {c} ({s:.1f} s)" for name, (c, s, _) in
                            sorted(self.by_kernel.items(), key=lambda item: -item[1][1]) if c)
        return (f"fmha: Triton compiled {compiles} kernels in {seconds:.1f} s of compile time "
                f"({loads} more loaded from its cache){'; ' + kernels if kernels else ''}")

    # pytest hooks ------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_KEY] = {name: list(entry) for name, entry in self.by_kernel.items()}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        counts = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if counts is not None:
            self.add(counts)
            self.workers_reported += 1

    def pytest_terminal_summary(self, terminalreporter):
        line = self.summary()
        if self.workers_reported:
            line += f" [{self.workers_reported} xdist workers reported]"
        terminalreporter.write_line(line)


def _label(src) -> str:
    """The kernel's module and name; the suite's patched copies (mutants) count as one."""
    module = getattr(getattr(src, "fn", None), "module", "") or ""
    if module.startswith("fmha._mutant"):
        module = "regressions mutants"
    return f"{module.removeprefix('fmha.kernels.').removeprefix('fmha.')}.{getattr(src, 'name', '?')}"
