"""Run one regression case in a child process that can be killed, so a kernel that hangs or
crashes its process (a segmentation fault under the interpreter, an illegal memory access
that poisons the CUDA context) costs one failed case with a clear reason, never the run.

The child reports when it has imported everything; the timeout counts from then, so it
bounds the kernel, not Python's start-up.
"""

from __future__ import annotations

import importlib
import multiprocessing
import signal

START_TIMEOUT_S = 300  # imports (torch, triton) on a cold machine
# The kernel itself, its first compiles included (about 5 s each on a loaded GPU runner): a
# hang costs its test this long, so it is no longer than that needs.
CASE_TIMEOUT_S = {"cpu": 5, "cuda": 20}


def _case(cases: str, index: int):
    """(case, symptom checks): case `index` of trap `cases`, or of the tuple of samples at the
    'module:attr' path `cases` (a GPU kernel's own cases: regressions.cuda_mutants)."""
    if ":" in cases:
        module, attr = cases.split(":")
        return getattr(importlib.import_module(module), attr)[index], ()
    from fmha.regressions.traps import TRAPS

    return TRAPS[cases].cases[index], TRAPS[cases].symptoms


def _child(conn, kernel_spec: str, cases: str, case_index: int, device: str) -> None:
    from fmha.regressions.selection import resolve_kernel
    from fmha.regressions.trap import check_case

    kernel = resolve_kernel(kernel_spec)
    case, symptoms = _case(cases, case_index)
    conn.send(("ready", None))
    try:
        conn.send(("done", check_case(kernel, case, device, symptoms)))
    except Exception as e:  # noqa: BLE001 -- the exception is the finding, reported to the parent
        conn.send(("raised", f"{type(e).__name__}: {e}"))


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def check_case_isolated(kernel_spec: str, cases: str, case_index: int, device: str,
                        timeout_s: float | None = None) -> list[str]:
    """check_case in a spawned child: its failures, or one failure naming the hang or crash.

    `kernel_spec` is anything --fmha-kernel takes (regressions.selection): a registry name, a
    'module:attr' path, or 'mutant:<name>'. `cases` is a trap's id or the 'module:attr' path
    of a tuple of samples; `case_index` picks one.
    """
    timeout_s = CASE_TIMEOUT_S[device] if timeout_s is None else timeout_s
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(sender, kernel_spec, cases, case_index, device), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the isolated child did not start within {START_TIMEOUT_S} s")
        try:
            receiver.recv()  # ready
            if not receiver.poll(timeout_s):
                return [f"hang: no result within {timeout_s} s; the child process was killed"]
            status, payload = receiver.recv()
        except EOFError:
            child.join(10)
            return [f"crash: the child process died ({describe_exit(child.exitcode)}) while running the kernel"]
        if status == "raised":
            return [f"raised {payload}"]
        return payload
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
        receiver.close()
