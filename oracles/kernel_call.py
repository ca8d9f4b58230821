"""One call of a kernel per the contract, and what it returned (`Run`).

The output buffer is poisoned with a NaN carrying a payload no arithmetic produces, so an
element the kernel never wrote is told apart from a NaN it computed; it is a view into a wider
buffer of poison (hazard `poison-around-out`), so a kernel that writes as if out= were packed,
or past a row, is caught. The call's inputs are read-only: a kernel that changes a byte of
their storage fails, naming the input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fmha.contract import KernelEntry
from fmha.contract.paged_validation import output_shape
from fmha.oracles import guard  # from here on every call of an entry is guarded
from fmha.oracles.hazards import DRAWN
from fmha.oracles.inputs import Inputs
from fmha.oracles.storage import lay_out, record, tally as tally_storage

# Quiet NaNs with a payload: a NaN a kernel computes (0/0, inf - inf) is the canonical one.
POISON_BITS = {torch.bfloat16: 0x7FD5, torch.float16: 0x7E55, torch.float32: 0x7FC05A5A}
INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
# Poison before and after each row of out=: 8 elements keep a 16-byte aligned view at 2-byte dtypes.
OUT_MARGIN = 8


def _signed(bits: int, dtype: torch.dtype) -> int:
    width = 16 if INT_VIEW[dtype] == torch.int16 else 32
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def poisoned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    bits = torch.full(shape, _signed(POISON_BITS[dtype], dtype), dtype=INT_VIEW[dtype], device=device)
    return bits.view(dtype)


def still_poisoned(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_VIEW[t.dtype]) == _signed(POISON_BITS[t.dtype], t.dtype)


def poisoned_out(shape, dtype: torch.dtype, device, spec: str = "", argument=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): out of `shape` a view into a buffer of poison with OUT_MARGIN elements of it
    before and after each row, laid out in the storage form `spec` of `argument`'s record
    (fmha.oracles.storage) besides; `buffer` is the whole of it, flat."""
    rows = poisoned((*shape[:-1], shape[-1] + 2 * OUT_MARGIN), dtype, device)
    if spec:
        rows = lay_out(rows, argument, spec, poisoned((), dtype, device))
    out = rows[..., OUT_MARGIN:OUT_MARGIN + shape[-1]]
    storage = out.untyped_storage()
    buffer = torch.empty(0, dtype=dtype, device=device).set_(storage, 0, (storage.nbytes() // out.element_size(),))
    return buffer, out


def out_for(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): the poisoned out= a call of `inputs` is handed, in the sample's storage form for it."""
    p = inputs.problem
    return poisoned_out(output_shape(p, total_q=inputs.q.shape[0]), p.dtype, inputs.q.device,
                        inputs.sample.storages.get("out", ""), record("out", p))


def _assert_margins_kept(kernel: KernelEntry, buffer: torch.Tensor, out: torch.Tensor,
                         before: torch.Tensor | None = None) -> None:
    """Every element of out='s buffer that is not out's still holds the poison (or, with
    `before`, the bytes it held before the call)."""
    outside = torch.ones(buffer.numel(), dtype=torch.bool, device=buffer.device)
    outside.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(False)
    kept = still_poisoned(buffer) if before is None else buffer.view(INT_VIEW[buffer.dtype]) == before.view(
        INT_VIEW[buffer.dtype])
    written = outside & ~kept
    if bool(written.any()):
        raise AssertionError(
            f"{kernel.name}: wrote outside out= ({int(written.sum())} of the {int(outside.sum())} elements of poison "
            f"around it, the first at element {int(written.nonzero()[0])} of its buffer): out= is a view of shape "
            f"{tuple(out.shape)}, strides {tuple(out.stride())}, storage offset {out.storage_offset()}; write "
            "through its strides")


@dataclass
class Run:
    """What one call returned."""

    inputs: Inputs
    o: torch.Tensor
    lse: torch.Tensor | None
    unwritten: torch.Tensor | None  # elements of out= still holding the poison


def run_kernel(kernel: KernelEntry, inputs: Inputs, use_out: bool | None = None, caller=None,
               stale_out: torch.Tensor | None = None, counted: bool = True) -> Run:
    """Call the kernel per the contract; pass a poisoned out= when it supports out. Its inputs
    are read-only: a kernel that changes any byte of their storage fails, naming the input.
    `caller` makes the call in place of the guarded entry (fmha.oracles.production's contexts);
    with `stale_out`, out= and the buffer around it hold its values instead of the poison; a call
    not `counted` (a replay) adds nothing to the run's tallies of hazards and storage."""
    __tracebackhide__ = True  # pytest: a failed call shows the kernel's frames and the message (--fulltrace: these)
    if use_out is None:
        use_out = "out" in kernel.capabilities_on(inputs.q.device.type).features
    kwargs = inputs.kwargs()
    out = before = None
    if use_out:
        buffer, out = out_for(inputs)
        if stale_out is not None:
            values = stale_out.reshape(-1)
            buffer.copy_(values.repeat(buffer.numel() // values.numel() + 1)[:buffer.numel()].flip(0))
            before = buffer.clone()
        kwargs["out"] = out
        DRAWN["poison-around-out"] += counted
    call = {"q": inputs.q, "k": inputs.k, "v": inputs.v, **kwargs}
    if counted:
        tally_storage(call, inputs.problem)
    before_inputs = _storages(call)
    result = (caller or kernel)(inputs.q, inputs.k, inputs.v, **kwargs)
    _assert_unchanged(kernel, call, before_inputs)
    o, lse = outputs(kernel, inputs, result)
    if out is not None and o.data_ptr() != out.data_ptr():
        raise AssertionError(f"{kernel.name}: out= was given but the returned o is a different tensor")
    if out is not None:
        _assert_margins_kept(kernel, buffer, out, before)
    unwritten = still_poisoned(o) if out is not None and before is None else None
    return Run(inputs, o, lse, unwritten)


def _storages(call: dict) -> dict:
    """A copy of the bytes of every input tensor's storage (past the view's elements too: what a
    kernel must not write includes the slots and rows it must not read), by the argument that
    names it first; out= is the kernel's to write."""
    copies, seen = {}, set()
    for name, value in call.items():
        if name == "out" or not isinstance(value, torch.Tensor) or not value.numel():
            continue
        storage = value.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        copies[name] = (value, storage_bytes(value).clone())
    return copies


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of t's storage, as one uint8 tensor over it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def view_on(storage: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A plain tensor over `storage`'s memory with `like`'s dtype, shape, strides and offset."""
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(storage.untyped_storage(), like.storage_offset(),
                                                                    like.shape, like.stride())


def _assert_unchanged(kernel: KernelEntry, call: dict, before: dict) -> None:
    for name, (tensor, copy) in before.items():
        changed = storage_bytes(tensor) != copy
        if bool(changed.any()):
            first = int(torch.nonzero(changed)[0])
            raise AssertionError(
                f"{kernel.name}: the kernel modified its input {name} ({int(changed.sum())} of {changed.numel()} bytes of "
                f"its storage, the first at byte {first}; the contract's inputs are read-only)")


def outputs(kernel: KernelEntry, inputs: Inputs, result) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(o, lse) as the contract says, or an AssertionError saying what came back instead."""
    __tracebackhide__ = True
    p = inputs.problem
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.Tensor)):
        raise AssertionError(f"{kernel.name}: expected (o, lse) with lse a tensor or None, got {_described(result)}")
    o, lse = result
    expected = output_shape(p, total_q=inputs.q.shape[0])
    if tuple(o.shape) != expected or o.dtype != p.dtype:
        raise AssertionError(f"{kernel.name}: o should be {expected} {p.dtype}, got {tuple(o.shape)} {o.dtype}")
    lse_shape = (p.heads_q, expected[0]) if p.ragged else (p.batch, p.heads_q, p.q_len)
    if lse is None and "lse" in kernel.capabilities_on(inputs.q.device.type).features:
        raise AssertionError(f"{kernel.name}: declares lse (Capabilities.features) but returned (o, None): return "
                             f"the {lse_shape} float32 log-sum-exp, or leave lse out of its features")
    if lse is not None and (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != lse_shape
                            or lse.dtype != torch.float32):
        raise AssertionError(f"{kernel.name}: lse should be {lse_shape} torch.float32 (the contract's: log Z per "
                             f"row, natural log), got {_described(lse)}")
    return from_memory(o), None if lse is None else from_memory(lse)


def from_memory(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor over t's storage, with t's shape, strides and offset: what is judged is
    what the memory holds, whatever bit, mode or wrapper stood between torch and it."""
    with guard.plain_torch():
        return view_on(t, t)


def _described(value) -> str:
    """What a kernel returned, as a message shows it: a tensor's shape and dtype, a tuple's length
    and what is in it."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}: ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__


def bitwise_difference(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """How `a` and `b` differ bit for bit (NaN payloads included): how many elements and the
    first; None when they do not."""
    if a.shape != b.shape:
        return f"shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}"
    differ = a.contiguous().view(INT_VIEW.get(a.dtype, a.dtype)) != b.contiguous().view(INT_VIEW.get(b.dtype, b.dtype))
    if not differ.any():
        return None
    first = tuple(torch.nonzero(differ)[0].tolist())
    return (f"{int(differ.sum())} of {differ.numel()} elements differ bitwise; first at {first}: "
            f"{a[first].item()!r} vs {b[first].item()!r}")


def first_difference(kernel: KernelEntry, inputs: Inputs) -> str | None:
    """How two identical calls of `kernel` on `inputs` differ (None: bit for bit the same)."""
    first, second = run_kernel(kernel, inputs), run_kernel(kernel, inputs)
    for name in ("o", "lse"):
        a, b = getattr(first, name), getattr(second, name)
        differ = None if a is None or b is None else bitwise_difference(a, b)
        if differ:
            return f"{name}: {differ}"
    return None
