"""What the judge's guard costs a call, beside what a judge in a separate process would.

    python -m fmha.ci.judge_cost [--calls N]

and what a judged call's replay costs in each of production's contexts (fmha.oracles.production).

The guard (fmha.oracles.guard) runs in the kernel's process, around each call. The
alternative keeps the oracle and the verdict out of the kernel's reach altogether: a judge
process that remakes the inputs from the sample itself (so the kernel cannot change what is
judged) and receives only the outputs. This times, on the suite's sample shapes, one call
unguarded and guarded, and the round trip to such a judge process on top of judging in-process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import torch

import fmha.properties.catalog  # noqa: F401 -- the judge's modules, all imported as in a test session
import fmha.regressions.traps  # noqa: F401
from fmha.contract import KernelEntry, Problem
from fmha.contract import kernel as kernel_module
from fmha.oracles import guard, production, replay_child
from fmha.oracles.check import judge_run
from fmha.oracles.kernel_call import Run, from_memory, run_kernel
from fmha.regressions.traps import TRAPS
from fmha.oracles.reference_kernel import CAPABILITIES, reference
from fmha.oracles.sample import Sample

SAMPLES = {  # what the suite's CPU draws look like, small to large
    "dense hd64 T4 S128 B2": Sample(problem=Problem(batch=2, q_len=4, kv_len=128, heads_q=8, heads_kv=2, head_dim=64)),
    "dense hd128 T64 S512 B1": Sample(problem=Problem(batch=1, q_len=64, kv_len=512, heads_q=8, heads_kv=8,
                                                      head_dim=128)),
}


def _per_call(fn, calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def _judge_process(requests, replies) -> None:
    """The separate judge: remakes the inputs from the sample, judges the outputs it is sent."""
    while (message := requests.get()) is not None:
        sample, o, lse = message
        inputs = sample.inputs()
        replies.put(judge_run(Run(inputs, o, lse, None)).passed)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    kernel = KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES)
    # the guard's own cost: a call that only makes an output of the right shape
    stand_in = KernelEntry(name="stand-in", fn=lambda q, k, v, **_: (torch.empty_like(q), None),
                           capabilities=CAPABILITIES)
    measured = {}
    for name, sample in SAMPLES.items():
        x = sample.inputs()
        hook = kernel_module._GUARD
        kernel_module.guard_calls(None)
        bare = _per_call(lambda: stand_in(x.q, x.k, x.v), args.calls)
        kernel_module.guard_calls(hook)
        guarded = _per_call(lambda: stand_in(x.q, x.k, x.v), args.calls)
        run = run_kernel(kernel, x)
        in_process = _per_call(lambda: judge_run(Run(run.inputs, run.o, run.lse, None)), max(args.calls // 10, 5))
        measured[name] = (bare, guarded, in_process, run)
    # the judge process starts after the in-process timings: its idle threads take no core from them
    context = multiprocessing.get_context("spawn")
    requests, replies = context.Queue(), context.Queue()
    judge = context.Process(target=_judge_process, args=(requests, replies), daemon=True)
    judge.start()
    print("| sample | a call, unguarded | guarded | judged in-process | judged in a separate process |")
    print("|---|---|---|---|---|")
    for name, (bare, guarded, in_process, run) in measured.items():
        def remote():
            requests.put((SAMPLES[name], run.o, run.lse))
            assert replies.get()

        separate = _per_call(remote, max(args.calls // 10, 5))
        print(f"| {name} | {bare:.3f} ms | {guarded:.3f} ms | {in_process:.2f} ms | {separate:.2f} ms |")
    print(f"The guard checks {sum(map(len, guard._PROBES.values()))} probes of the judge after each call; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads.")
    requests.put(None)
    judge.join()
    _replays(kernel, args.calls)


def _replays(kernel: KernelEntry, calls: int) -> None:
    """What a judged call's replay costs in each production context (the `reference` kernel's call
    included, beside its guarded call alone), and the checks of outputs and torch's state."""
    names = list(production.CONTEXTS)
    print("\n| sample | a guarded call | " + " | ".join(f"replayed: {n}" for n in names)
          + " | outputs from memory | torch's registrations (a test's end) |")
    print("|---|---|" + "---|" * (len(names) + 2))
    production.REPLAYS.children = 1 << 20
    replay_child.child()  # its start (about 2 s, once a process) is not a call's cost
    for name, sample in {**SAMPLES, "paged (a named case)": TRAPS["last-partial-page"].cases[0]}.items():
        x = sample.inputs()
        run = run_kernel(kernel, x)
        call = _per_call(lambda: run_kernel(kernel, x), max(calls // 10, 5))
        costs = []
        for context in names:
            def replayed(context=context):
                made = production.CONTEXTS[context].replay(kernel, run, judge_run)
                if isinstance(made, Run):
                    production.same_answer(kernel, run, made, context, judge_run)
            costs.append(_per_call(replayed, max(calls // 10, 5)))
        memory = _per_call(lambda: (from_memory(run.o), from_memory(run.lse)), calls)
        tables = _per_call(guard.registrations_changed, max(calls // 10, 5))
        print(f"| {name} | {call:.2f} ms | " + " | ".join(f"{c:.2f} ms" for c in costs)
              + f" | {memory:.3f} ms | {tables:.2f} ms |")


if __name__ == "__main__":
    main()
