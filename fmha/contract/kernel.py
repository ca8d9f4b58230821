"""One protocol for every kernel: fmha's own, PyTorch's, a third-party adapter, a plug-in.

A `KernelEntry` is a contract callable (`fn`: `o, lse = fn(q, k, v, *, scale=None, ...)`) and
what it supports: `capabilities` (per device where one name covers different code), and
`availability`, why it cannot run on this machine at all. `not_supported_reasons(problem,
device)` gives every reason it would not run a call, as xformers' dispatch does; tests skip
with them, strategies draw only what is left, and fmha.attention picks the first entry of its
priority list that has none.

fmha's own kernels are built by `implemented_by`: their `fn` checks the call against their
capabilities and then `apply`s the kernel to the checked `Problem`; a dispatcher that has
checked the call already calls `apply` itself, so a call is validated once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from fmha.contract.capabilities import FULL_CONTRACT, PROMISES, Capabilities
from fmha.contract.errors import NotSupportedError
from fmha.contract.problem import Problem
from fmha.contract.validation import check_attention_args

# The call's arguments a checked Problem already carries: not passed on to `apply`.
IN_THE_PROBLEM = ("causal", "window", "cache_layout", "extra_cache_layout")


def always_available(device) -> str | None:
    return None


# The judge's guard (fmha.oracles.guard) around every call of an entry, once the judge is imported:
# guard(entry, args, kwargs) runs the call and checks around it. None where no judge runs
# (fmha.attention, the benchmarks).
_GUARD = None


def guard_calls(guard) -> None:
    global _GUARD
    _GUARD = guard


@dataclass(frozen=True)
class KernelEntry:
    """A kernel under test: a contract callable plus what it supports."""

    name: str
    fn: Callable
    capabilities: Capabilities = FULL_CONTRACT
    # Where one name covers different code per device (SDPA flash on CPU and on CUDA).
    device_capabilities: Mapping[str, Capabilities] = field(default_factory=dict)
    # Returns why the kernel cannot run on this machine at all (missing backend), or None.
    availability: Callable[[str], str | None] = always_available
    # Devices on which it runs when no --fmha-kernel is given (slow-to-compile ones opt out).
    default_devices: tuple[str, ...] = ("cpu", "cuda")
    description: str = ""
    # fmha's own kernels: the kernel applied to a checked call,
    # apply(problem, q, k, v, *, scale, sink, out, **source tensors) -> (o, lse).
    apply: Callable | None = None

    def capabilities_on(self, device: str) -> Capabilities:
        return self.device_capabilities.get(device, self.capabilities)

    def promises(self, device: str, promise: str) -> bool:
        if promise not in PROMISES:
            raise ValueError(f"promise: expected one of {', '.join(PROMISES)}, got {promise!r}")
        return promise in self.capabilities_on(device).promises

    def not_supported_reasons(self, problem: Problem | None, device, needs: Iterable[str] = (),
                              any_source: Iterable[str] = ()) -> list[str]:
        """Every reason this kernel's declaration excludes a call (`problem`), or with None any
        call of a test, a law or a named case that uses `needs` and one of `any_source`
        (Capabilities.not_supported_reasons): the one place that decides what a kernel is not
        asked to run, and why. Empty: it runs it."""
        unavailable = self.availability(device)
        if unavailable:
            return [unavailable]
        device_type = getattr(device, "type", device)
        return self.capabilities_on(device_type).not_supported_reasons(problem, device_type, needs, any_source)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # pytest: the call's failure is the kernel's or the judge's
        guard = _GUARD
        return self.fn(*args, **kwargs) if guard is None else guard(self, args, kwargs)


def implemented_by(name: str, apply: Callable, capabilities: Capabilities, *,
                   availability: Callable[[str], str | None] = always_available,
                   default_devices: tuple[str, ...] = ("cpu", "cuda"), description: str = "") -> KernelEntry:
    """fmha's kernel `apply` as an entry whose contract call checks the call first: a call
    outside `capabilities`, or on a machine where it cannot run, is a NotSupportedError."""

    def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, **source_args):
        problem = check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                                       capabilities=capabilities, **source_args)
        unavailable = availability(q.device)
        if unavailable:
            raise NotSupportedError(f"{name}: {unavailable}")
        return apply(problem, q, k, v, scale=scale, sink=packed_sink(sink), out=out, **source_tensors(source_args))

    attention.__name__ = f"attention_by_{name.replace('-', '_')}"
    return KernelEntry(name=name, fn=attention, capabilities=capabilities, availability=availability,
                       default_devices=default_devices, description=description, apply=apply)


def packed_sink(sink):
    """The sink as fmha's kernels read it, Hq floats one after another: the contract lets a caller
    pass any strides (a step, an offset, stride 0), so a strided one is copied (Hq floats)."""
    return None if sink is None else sink.contiguous()


def source_tensors(call: dict) -> dict:
    """A call's keyword arguments that `apply` takes beside the problem: the paged or sparse
    tensors it names (not None), without what the problem carries."""
    return {name: value for name, value in call.items() if value is not None and name not in IN_THE_PROBLEM}


@dataclass(frozen=True)
class MergeEntry:
    """A D5 merge callable under test."""

    name: str
    fn: Callable
    devices: tuple[str, ...] = ("cpu", "cuda")
    description: str = ""
    availability: Callable[[str], str | None] = always_available

    def not_supported_reasons(self, device: str) -> list[str]:
        unavailable = self.availability(device)
        if unavailable:
            return [unavailable]
        return [] if device in self.devices else [f"no {device} merge (runs on {', '.join(self.devices)})"]

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # pytest: the call's failure is the kernel's or the judge's
        guard = _GUARD
        return self.fn(*args, **kwargs) if guard is None else guard(self, args, kwargs)
