"""Judged calls replayed as production makes them (docs/contract.md, "How kernels are judged").

A kernel that can tell it is being tested can be right under the suite and wrong in a serving
process: it may look at its call stack, at the environment, at the NaN the suite puts wherever
nothing may be read. A sample of each run's judged calls is made again where the test is out
of sight, and must give the same bits (a kernel promising bitwise determinism) or pass the same
verdict. One record per context (`CONTEXTS`):

- `thread`: on a fresh thread, with no frame of the judge (or of pytest) on its stack;
- `stale`: every element the sample's fill put where nothing may be read (slots past a
  request's keys, pages no table names, the gaps of strided views, the buffer around out=)
  holding a finite stale value (other keys of the same tensor, another call's output) in place
  of NaN; `out=` is then checked against its own bytes, not the poison;
- `out-reused`: a call of the same shapes with new values and no out=, judged on its own, while
  the buffer the judged call wrote is alive (the guard fails a call that changes it: a kernel
  that keeps a caller's out= as its workspace);
- `child`: in a clean child process (fmha.oracles.replay_child): an environment of an allowlist,
  a plain script's argv, nothing imported but torch and the kernel's module, the parent's
  threads and determinism flags; the arguments go as bytes, the outputs come back as bytes.

Each test twins its first poisoned calls (`twins`: every paged law and named case is
twinned in every run); a share of the tests (`share`, drawn from the run's seed and the
test's id, so a rerun replays the same) also replays a judged call in one of the other
contexts, the first tried drawn the same way (`child` as often as `children` lets a process), and each kernel's
first judged call of a process not twinned is replayed in the cheap ones. The fmha plug-in
sets them from the profile (fmha.properties.run_settings.REPLAYS). The soak (a call made
again after many cheap calls) is a law of its own (`late_in_a_long_process`,
properties/dense_laws.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from fmha.contract import KernelEntry, NotSupportedError
from fmha.oracles import guard, replay_child
from fmha.oracles.inputs import Inputs
from fmha.oracles.kernel_call import Run, bitwise_difference, run_kernel, storage_bytes, view_on


@dataclass
class Replays:
    """What this test and this process have left; a caller outside pytest replays nothing."""

    children: int | None = None  # this process's, set once
    soak: int = 1 << 12
    twins: int = 0  # this test's
    others: int = 0  # this test's
    only: tuple[str, ...] = ()  # every judged call replayed in each of these (`replaying_in`)
    made: dict = field(default_factory=dict)  # this test's replayed calls -> their context
    met: set = field(default_factory=set)  # the kernels whose first judged call this process replayed
    first: int = 0  # this test's first other context, drawn (an index of the others, rotated)


REPLAYS = Replays()
__judge_state__ = ("REPLAYS", "_SOAKED")  # fmha.oracles.guard: not a part of what judges


def start_of_test(test: str, twins: int, share: float, children: int, soak: int) -> None:
    """Test `test` (the run's seed and the test's id) starts with `twins` of its first poisoned
    calls to twin with stale values and, drawn from `test` with probability `share`, a judged
    call (the first not twinned) to replay in another context; the process's child replays are
    set to `children` the first time; the soak law soaks `soak` calls
    (fmha.properties.run_settings.Budget)."""
    draw = random.Random(test)
    REPLAYS.twins = twins
    REPLAYS.others = int(draw.random() < share)
    REPLAYS.first = draw.randrange(1 << 16)
    REPLAYS.made.clear()
    REPLAYS.soak = soak
    if REPLAYS.children is None:
        REPLAYS.children = children


def new_process() -> None:
    """Forget what this process has replayed (its child replays spent, the kernels whose first
    call it replayed), as a process that starts would: the kill matrix's rows, computed one after
    another in one worker, are each judged as one CI process judges its tests, whatever ran
    before them."""
    vars(REPLAYS).update(vars(Replays()))


@contextlib.contextmanager
def replaying_in(*names: str):
    """Within it every judged, passing call is replayed in each of the contexts `names` (none:
    in no context), whatever the budget; a context that cannot be made fails, saying why."""
    saved = REPLAYS.only, REPLAYS.children
    REPLAYS.only, REPLAYS.children = names or ("",), 1 << 20
    try:
        yield
    finally:
        REPLAYS.only, REPLAYS.children = saved


# -- the contexts -----------------------------------------------------------------------------

def _on_a_fresh_thread(kernel: KernelEntry, run: Run, judge) -> Run | str:
    """The call on a new thread whose stack holds the standard library's frames and the kernel's."""
    guard.release_answers()  # the guard, whose frame this call is made without, would have
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        made = run_kernel(kernel, run.inputs, use_out=run.unwritten is not None, counted=False,
                          caller=lambda *args, **kwargs: pool.submit(kernel.fn, *args, **kwargs).result())
    tampered = guard.judge_changes()  # the guard was not around this call: what it would have seen
    if tampered:
        raise AssertionError(f"{kernel.name}: the judge refuses this call (replayed on a fresh thread): "
                             + "; ".join(tampered))
    return made


def _with_stale_values(kernel: KernelEntry, run: Run, judge) -> Run | str:
    twin = stale_twin(run.inputs)
    if twin is None:  # the other contexts take their turn: this one is for a call with something to hide
        return "its inputs hold no poison (or are not its sample's own: a law changed them)"
    return run_kernel(kernel, twin, use_out=run.unwritten is not None, stale_out=run.o, counted=False)


def _without_out_while_the_last_is_alive(kernel: KernelEntry, run: Run, judge) -> None | str:
    """A call of the same shapes with new values and no out=, judged on its own, while the out=
    buffer the judged call wrote is alive: the guard fails the call if that buffer changes."""
    if run.unwritten is None:
        return "the judged call had no out="
    other = run.inputs.sample.replace(seed=run.inputs.sample.seed + 1).inputs(run.o.device)
    made = run_kernel(kernel, other, use_out=False, counted=False)
    verdict = judge(made)
    assert verdict.passed, verdict.message(f"{kernel.name} {other.sample.id}: a call without out= after one with it")
    return None


def _in_a_clean_child(kernel: KernelEntry, run: Run, judge) -> Run | str:
    if not REPLAYS.children:
        return "this process's child replays are spent"
    spec = replay_child.spec_of(kernel)
    if spec is None:
        return f"{kernel.name} cannot be imported by name in another process"
    REPLAYS.children -= 1
    return run_kernel(kernel, run.inputs, use_out=run.unwritten is not None, counted=False,
                      caller=replay_child.child().caller(spec))


@dataclass(frozen=True)
class Context:
    name: str
    where: str  # as a failure names it
    # The replayed call (judged against the first), None where the context judged it itself, or
    # why it cannot be made.
    replay: Callable[[KernelEntry, Run, Callable], Run | str | None]  # (kernel, judged run, judge)


CONTEXTS = {c.name: c for c in (
    Context("stale", "with finite stale values where the suite puts NaN (unread slots, gaps, out=)",
            _with_stale_values),
    Context("thread", "on a fresh thread with no judge frame on its stack", _on_a_fresh_thread),
    Context("out-reused", "without out= while the buffer of the call before is alive",
            _without_out_while_the_last_is_alive),
    Context("child", "in a clean child process (an allowlisted environment, a plain script's argv, nothing "
                     "imported but torch and the kernel's module)", _in_a_clean_child),
)}


# The contexts each kernel's first judged call of a process is replayed in, whatever the share: the
# cheap ones (a child process costs its start, in every nested session too).
EVERY_KERNEL = ("thread", "out-reused")


def replay(kernel: KernelEntry, run: Run, judge: Callable) -> None:
    """Replay a judged, passing call as this test's budget says: twinned with stale values while
    the test has twins left and the call holds poison; else, a kernel's first in this process, in
    each of EVERY_KERNEL; else, while the test has replays left, in a clean child while the process
    has them, else the next other context. Raises an AssertionError naming the context where the
    answer is not the same. `judge` gives a run's verdict (fmha.oracles.check.judge_run, which calls this)."""
    if REPLAYS.only:
        for name in filter(None, REPLAYS.only):
            why = _replayed_in(name, kernel, run, judge)
            if why is not None:
                raise AssertionError(f"{kernel.name}: cannot replay {CONTEXTS[name].where}: {why}")
        return
    call = (kernel.name, run.inputs.sample.id, run.inputs.sample.values_seed)
    if call in REPLAYS.made:  # hypothesis making a failing example again: its replay fails again, the same way
        _replayed_in(REPLAYS.made[call], kernel, run, judge)
        return
    if REPLAYS.twins > 0:
        REPLAYS.made[call] = "stale"
        if _replayed_in("stale", kernel, run, judge) is None:
            REPLAYS.twins -= 1
            return
        del REPLAYS.made[call]
    if kernel.name not in REPLAYS.met:  # every kernel's first call, on a fresh thread and beside its out=
        REPLAYS.met.add(kernel.name)
        for name in EVERY_KERNEL:
            REPLAYS.made[call] = name
            _replayed_in(name, kernel, run, judge)
        return
    if REPLAYS.others <= 0:
        return
    REPLAYS.others -= 1
    # A clean child first while this process has them: the one context a kernel that looks at its
    # environment or its process (argv, the modules imported, pytest's variables) cannot tell from
    # production; the others (each kernel's first call has them) in turn after it.
    others = [name for name in CONTEXTS if name not in ("stale", "child")]
    start = REPLAYS.first % len(others)
    for name in ["child"] * bool(REPLAYS.children) + others[start:] + others[:start]:
        REPLAYS.made[call] = name
        if _replayed_in(name, kernel, run, judge) is None:
            return
    del REPLAYS.made[call]


def _replayed_in(name: str, kernel: KernelEntry, run: Run, judge: Callable) -> str | None:
    """`run` made again in context `name` and judged; why it could not be made, or None."""
    replayed = CONTEXTS[name].replay(kernel, run, judge)
    if isinstance(replayed, str):
        return replayed
    if replayed is not None:
        same_answer(kernel, run, replayed, CONTEXTS[name].where, judge)
    return None


def same_answer(kernel: KernelEntry, judged: Run, replayed: Run, where: str, judge: Callable) -> None:
    """`replayed` gives `judged`'s bits (a kernel promising determinism) or passes its verdict
    (against the oracle made again: the guard emptied the judged call's before the replay)."""
    p = judged.inputs.problem
    rerun = f"the call judged in this test, made again {where}"
    if "bitwise_deterministic" in kernel.capabilities_on(judged.o.device.type).promises:
        for name in ("o", "lse"):
            a, b = getattr(judged, name), getattr(replayed, name)
            differ = "one is None" if (a is None) != (b is None) else a is not None and bitwise_difference(a, b)
            if differ:
                raise AssertionError(f"{kernel.name} {judged.inputs.sample.id}: {rerun}, gives other bits ({name}: "
                                     f"{differ}) though it promises bitwise_deterministic: its answer depends on "
                                     "whether it is being tested")
        return
    verdict = judge(replayed)
    assert verdict.passed, verdict.message(f"{kernel.name} {judged.inputs.sample.id} ({p.dtype}): {rerun}")


# -- stale values where the poison was ---------------------------------------------------------

_MARK = 0.5  # a finite fill: where a byte-coded cache's NaN build and this one differ, nothing reads


def stale_twin(x: Inputs) -> Inputs | None:
    """x's call with every element of poison holding a stale finite value instead: in a float
    tensor each NaN becomes another element of the same tensor; in a byte-coded cache each byte
    the sample's fill put there becomes the same byte of another token. x's reads are the same
    bytes. None when x holds no poison, or a byte-coded cache whose call is not its sample's own."""
    device = x.q.device
    names = [n for n in ("q", "k", "v", "sink", *x.source_args) if isinstance(_arg(x, n), torch.Tensor)]
    coded = [n for n in names if _arg(x, n).dtype == torch.uint8]
    if not coded and not any(_arg(x, n).is_floating_point() and bool(storage_bytes(_arg(x, n)).view(_arg(x, n).dtype)
                                                                     .isnan().any()) for n in names):
        return None  # the common case, told without a copy
    if coded:
        plain, marked = x.sample.inputs(device), x.sample.inputs(device, tail_fill=_MARK)
    twins, stale_any = {}, False
    g = torch.Generator().manual_seed(x.sample.values_seed)
    for name in names:
        t = _arg(x, name)
        key = t.untyped_storage().data_ptr()
        if key in twins:
            continue
        copy = storage_bytes(t).clone()
        if name in coded:
            theirs, mark = _arg(plain, name), _arg(marked, name)
            if not (isinstance(theirs, torch.Tensor) and isinstance(mark, torch.Tensor)
                    and copy.shape == storage_bytes(theirs).shape == storage_bytes(mark).shape
                    and torch.equal(copy, storage_bytes(theirs))):
                return None
            stale_any |= _stale_codes(copy, copy != storage_bytes(mark), t, g)
        elif t.is_floating_point():
            stale_any |= _stale_floats(copy, t, g)
        twins[key] = copy
    if not stale_any:
        return None
    tensors = {n: view_on(twins[_arg(x, n).untyped_storage().data_ptr()], _arg(x, n)) for n in names}
    if x.v is x.k:
        tensors["v"] = tensors["k"]
    return Inputs(x.sample, tensors["q"], tensors["k"], tensors["v"], tensors.get("sink"),
                  {n: tensors.get(n, v) for n, v in x.source_args.items()}, x.oracle_sources)


def _arg(x: Inputs, name: str):
    return getattr(x, name) if name in ("q", "k", "v", "sink") else x.source_args.get(name)


def _stale_floats(copy: torch.Tensor, t: torch.Tensor, g: torch.Generator) -> bool:
    """Each NaN of `copy` (t's storage bytes) becomes a finite element of the same storage."""
    values = copy.view(t.dtype)
    poison = torch.isnan(values)
    donors = torch.nonzero(~poison & torch.isfinite(values)).flatten()
    if not bool(poison.any()) or not donors.numel():
        return False
    values[poison] = values[donors[torch.randint(donors.numel(), (int(poison.sum()),), generator=g).to(donors.device)]]
    return True


def _stale_codes(copy: torch.Tensor, fill: torch.Tensor, t: torch.Tensor, g: torch.Generator) -> bool:
    """In a byte-coded cache, each byte the fill put in a token becomes the byte at the same place
    in a token it did not touch (codes from codes, scales from scales); the bytes around the view
    (its pages' padding, NaN codes in every build) become bytes of its tokens."""
    view = view_on(copy, t)
    inside = torch.zeros_like(copy, dtype=torch.bool)
    view_on(inside, t).fill_(True)
    stale = view_on(fill, t).bool()
    donors = torch.nonzero(~stale.any(-1))
    if not donors.numel():
        return False
    where = torch.nonzero(stale)
    if where.numel():
        pick = donors[torch.randint(donors.shape[0], (where.shape[0],), generator=g).to(donors.device)]
        view[tuple(where.T)] = view[(*pick.T, where[:, -1])]
    outside = torch.nonzero(~inside).flatten()
    if outside.numel():
        read = copy[inside]
        copy[outside] = read[torch.randint(read.numel(), (outside.numel(),), generator=g).to(read.device)]
    return bool(where.numel() or outside.numel())


# -- late in a long process ----------------------------------------------------------------------

_SOAKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # calls the soak made, by kernel function
REAL_CALL_EVERY = 512  # of the soak's calls one in this many is the judged call itself; the rest are cheap


def soak(kernel: KernelEntry, x: Inputs, calls: int) -> int:
    """Make calls of `kernel` until the soak has made `calls` of it in this process: x's own call
    one time in REAL_CALL_EVERY, in between a cheap one (counters, caches and buffers age all the
    same): x with no query rows where the kernel takes that, else its first request's last row
    alone where its declaration allows one row, else x's own. Returns how many it made now."""
    done = _SOAKED.get(kernel.fn, 0)
    if done >= calls:
        return 0
    kwargs, cheap, made = x.kwargs(), _cheap_forms(kernel, x), done
    while made < calls:
        real = made % REAL_CALL_EVERY == 0 or not cheap
        try:
            kernel.fn(*((x.q, x.k, x.v) if real else cheap[0]), **kwargs)
        except NotSupportedError:
            if real:
                raise
            cheap.pop(0)  # a dense call of no rows is not in any declaration: PyTorch's fused kernels refuse it
            continue
        made += 1
        _SOAKED[kernel.fn] = made
    return calls - done


def _cheap_forms(kernel: KernelEntry, x: Inputs) -> list[tuple]:
    """Cheaper calls than x's for the soak, cheapest first: x with no query rows, its first
    request's last row alone (where the declaration allows one row)."""
    if x.q.dim() != 4 or x.problem.ragged or x.problem.source != "dense":
        return []
    caps = kernel.capabilities_on(x.q.device.type)
    one_row = not caps.q_len_equals_kv_len and caps.q_len_multiple_of == 1
    return [(x.q[:, :0], x.k, x.v)] * caps.empty_query_requests + [(x.q[:1, -1:], x.k[:1], x.v[:1])] * one_row
