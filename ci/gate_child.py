"""The nightly gate's runs in a child process that can be killed: a kernel that hangs on one
config, kills its process, or leaves the CUDA context unusable costs that run, recorded as
raised with the bound or the signal that ended it, and the gate goes on in a fresh child.

One child a gate (a shard), kept for every run and started again only after a fault; its imports
are not counted against the bound, which is for the kernel's run: its call, the oracle and the
verdict (`--run-timeout`, fmha.ci.nightly.RUN_TIMEOUT_S). On the CPU a
child is forked from a server that imported the gate once, so a fault costs no new imports; on
a GPU it is spawned afresh (a process forked after CUDA was initialised cannot use it).
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from fmha.ci.run_record import RunRecord, raised, signature
from fmha.regressions.isolation import START_TIMEOUT_S, describe_exit


def _serve(conn, device: str, path: list[str], cwd: str) -> None:
    """The child: judge each (kernel spec, problem, record) it is sent, until its parent closes.
    It imports plug-ins as its parent does now (a child forked from the server has the server's
    path and directory)."""
    sys.path[:] = path
    os.chdir(cwd)
    from fmha.ci.gpu_runner import cuda_context_error
    from fmha.ci.gate_judge import judged
    from fmha.regressions.selection import resolve_kernel

    kernels = {}
    conn.send("ready")
    while True:
        try:
            spec, problem, record = conn.recv()
        except EOFError:
            return
        try:
            if spec not in kernels:
                kernels[spec] = resolve_kernel(spec)
            result = judged(kernels[spec], problem, record, device)
        except Exception as e:  # noqa: BLE001 -- the kernel's import or the judge: that run's error
            result = raised(record.kernel, record.part, record.what, e, dtype=record.dtype, where=record.where)
        poisoned = device == "cuda" and result.outcome == "raised" and cuda_context_error()
        if poisoned:
            result = result.replace(message=f"{result.message} (it left the CUDA context unusable: {poisoned}; "
                                            "the next run gets a fresh process)")
        conn.send((result, not poisoned))
        if poisoned:
            return


def fault(record: RunRecord, message: str) -> RunRecord:
    """The record of a run that never answered: raised, with why."""
    return record.replace(outcome="raised", message=message, signature=signature(message), metrics={})


class GateChild:
    """`judge(spec, problem, record)` in the child: the judged record, or the fault's."""

    def __init__(self, device: str, bound_s: float):
        self.device, self.bound_s = device, bound_s
        if device == "cpu":
            self._context = multiprocessing.get_context("forkserver")
            self._context.set_forkserver_preload(["fmha.ci.gate_judge", "fmha.registry"])
        else:
            self._context = multiprocessing.get_context("spawn")
        self._process = self._conn = None

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(child, self.device, list(sys.path), os.getcwd()),
                                              daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        if not parent.poll(START_TIMEOUT_S) or parent.recv() != "ready":
            self.close()
            raise RuntimeError(f"the gate's child process did not start within {START_TIMEOUT_S} s")

    def judge(self, spec: str, problem, record: RunRecord) -> RunRecord:
        if self._process is None or not self._process.is_alive():
            self.close()
            self._start()
        self._conn.send((spec, problem, record))
        if not self._conn.poll(self.bound_s):
            self.close()
            return fault(record, f"hang: no answer within {self.bound_s:g} s (--run-timeout); the process running "
                                 "the kernel was killed and the gate went on in a fresh one")
        try:
            result, going_on = self._conn.recv()
        except EOFError:
            self._process.join(10)
            code = self._process.exitcode
            self.close()
            return fault(record, f"crash: the process running the kernel died ({describe_exit(code)}); the gate "
                                 "went on in a fresh one")
        if not going_on:  # it poisoned its CUDA context and exits
            self.close()
        return result

    def close(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(10)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def __enter__(self) -> GateChild:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
