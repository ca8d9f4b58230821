"""Nothing outside the call's tensors is read (docs/contract.md), checked on the CPU: each paged
or sparse tensor of a call (block table, lengths, indices, caches) is copied to the end of a
memory mapping of its own, followed by a page no process may touch, and the block table is
exactly as long as the longest request needs. A kernel that reads one element past any of them
dies of SIGSEGV on that page. The kernel runs in a child process, so the over-read costs a
named failure, not the run; after a crash the case is run again with each tensor guarded
alone, to name the one read past.

Guard pages see reads of host memory: native code and the Triton interpreter, which reads the
tensors where they are. On a GPU, `python -m fmha.ci.sanitize` runs the same cases under
compute-sanitizer's memcheck.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing

import torch

from fmha.oracles.inputs import Inputs
from fmha.oracles.sample import Sample
from fmha.regressions.isolation import START_TIMEOUT_S, describe_exit

GUARDED = ("block_table", "kv_lens", "cu_seqlens_q", "indices", "topk_len", "extra_indices", "extra_topk_len",
           "k", "v", "extra_k_cache")
CASE_TIMEOUT_S = 60  # the interpreter's calls, a case at most
_PROT_NONE = 0


def guarded(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor `t` whose last byte is followed by an inaccessible page."""
    nbytes = t.numel() * t.element_size()
    pages = -(-nbytes // mmap.PAGESIZE) + 1
    region = mmap.mmap(-1, pages * mmap.PAGESIZE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    if ctypes.CDLL(None, use_errno=True).mprotect(ctypes.c_void_p(start + (pages - 1) * mmap.PAGESIZE),
                                                  mmap.PAGESIZE, _PROT_NONE):
        raise OSError(ctypes.get_errno(), "mprotect: cannot make the guard page inaccessible")
    copy = torch.frombuffer(region, dtype=t.dtype, count=t.numel(), offset=(pages - 1) * mmap.PAGESIZE - nbytes)
    return copy.view(t.shape).copy_(t)


def exact(x: Inputs) -> Inputs:
    """The call with a block table exactly as long as its longest request needs (the sample's
    layout gives every table a spare column of poison: a read past the table's end would find it)."""
    table = x.source_args.get("block_table")
    if table is None:
        return x
    pages = max(-(-int(n) // x.problem.block_size) for n in x.source_args["kv_lens"].tolist()) if len(table) else 0
    return x.with_tensors(source_args={**x.source_args, "block_table": table[:, :max(pages, 1)].contiguous()})


def guard(x: Inputs, names=GUARDED) -> Inputs:
    """`x` with each of `names` (that the call has) behind a guard page; k = v stays one tensor."""
    changes, args = {}, dict(x.source_args)
    for name in names:
        if name in ("k", "v"):
            if name == "v" and x.v is x.k:
                continue
            changes[name] = guarded(getattr(x, name))
        elif isinstance(args.get(name), torch.Tensor) and args[name].numel():
            args[name] = guarded(args[name])
    if "k" in changes and x.v is x.k:
        changes["v"] = changes["k"]
    return x.with_tensors(**changes, source_args=args)


def _child(conn, kernel_spec: str, samples: list[Sample], names) -> None:
    from fmha.regressions.selection import resolve_kernel

    kernel = resolve_kernel(kernel_spec)
    conn.send(("ready", None))
    for i, sample in enumerate(samples):
        x = guard(exact(sample.inputs("cpu")), names)
        conn.send(("case", i))
        try:
            kernel(x.q, x.k, x.v, **x.kwargs())
        except Exception:  # noqa: BLE001 -- a refusal or an error is judged elsewhere; only reads count here
            pass
    conn.send(("done", None))


def _context():
    """Children forked from a server that has imported torch and fmha once: a crash costs a
    fork, not an interpreter's start."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "fmha.regressions.guarded_reads", "fmha.regressions.selection"])
    return context


def _run(kernel_spec: str, samples: list[Sample], names=GUARDED) -> tuple[int | None, str]:
    """(index of the case the child died on, how it died), or (None, "") when it read nothing
    it must not."""
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(sender, kernel_spec, samples, names), daemon=True)
    child.start()
    sender.close()
    current = None
    try:
        if not receiver.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the guarded-reads child did not start within {START_TIMEOUT_S} s")
        while True:
            if not receiver.poll(CASE_TIMEOUT_S):
                raise RuntimeError(f"the guarded-reads child gave no sign of life for {CASE_TIMEOUT_S} s")
            try:
                status, payload = receiver.recv()
            except EOFError:
                child.join(10)
                if current is None:  # died loading the kernel or its cases: nothing was read, nothing checked
                    raise RuntimeError(f"the guarded-reads child for {kernel_spec} ended ({describe_exit(child.exitcode)}) "
                                       "before its first case: the reads were not checked (its stderr is above; a "
                                       "script that starts the session without `if __name__ == '__main__':` runs "
                                       "again in each child multiprocessing starts)")
                return current, describe_exit(child.exitcode)
            if status == "case":
                current = payload
            elif status == "done":
                return None, ""
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
        receiver.close()


def over_reads(kernel_spec: str, samples: list[Sample]) -> list[str]:
    """What the kernel read past, case by case (empty: nothing)."""
    crashed, how = _run(kernel_spec, samples)
    if crashed is None:
        return []
    sample = samples[crashed]
    x = sample.inputs("cpu")
    present = [name for name in GUARDED if isinstance({**x.source_args, "k": x.k, "v": x.v}.get(name), torch.Tensor)]
    culprits = [name for name in present if _run(kernel_spec, [sample], (name,))[0] is not None]
    named = (f"past the end of {' and '.join(culprits)}" if culprits
             else "past the end of one of its tensors (guarded one at a time, none alone faulted)")
    return [f"over-read: the kernel read {named} on {sample.id} (a guard page after it: {how}); nothing outside "
            "the call's tensors may be read"]
