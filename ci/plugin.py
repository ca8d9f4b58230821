"""pytest plumbing for fmha: kernel selection, device, markers, skips that carry reasons.

Installed with fmha as a pytest11 entry point, so it is active in any pytest session of that
environment, from any directory:

    pytest --pyargs fmha --fmha-kernel my_pkg.attn:fwd              # the suite, your kernel
    pytest --fmha-kernel sdpa-math --fmha-kernel my_pkg.attn:fwd    # repeatable
    pytest --fmha-merge torch-merge --fmha-merge my_pkg.merge:merge
    pytest --fmha-device cpu                                        # default: cuda if present
    pytest --fmha-known-failures my_known_failures.toml             # your kernels' ledger
    pytest --fmha-seed 1234                                         # the values of run 1234 again

A test of fmha's suite (or one marked `fmha_suite`) takes the `kernel` (or `merge_kernel`)
argument to run once per selected kernel. When
it is also parametrized with a `problem` or a `sample`, a combination the kernel does not
support becomes a skip whose message is the kernel's own reason, and so does a
NotSupportedError the kernel raises when called; `@pytest.mark.fmha_needs("lse")` adds
per-call needs to that check. A failing test with a kernel prints the command that reruns it.

Every run draws new values for the same cases: its seed (`--fmha-seed`, else a fresh one) is
in the header and in every rerun command, and each test draws under the seed mixed with the
name of its kernel (fmha.oracles.run_seed).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from _pytest import junitxml  # its report object, to keep the run's seed in the XML

from fmha.ci import bytecode, progress
from fmha.contract import KernelEntry, NotSupportedError, Problem
from fmha.oracles import run_seed, threads
from fmha.properties.run_settings import (DEVICE, KERNEL_SPECS, RUN_SEED, register_profiles, replay_settings,
                                          reproduce_command)
from fmha.regressions import selection

register_profiles()

MARKERS = {
    "gpu": "needs a CUDA device; skipped with a reason elsewhere",
    "slow": "takes seconds through the CPU interpreter: skipped on the CPU unless --fmha-slow",
    "nightly": "nightly tier: runs only with --fmha-nightly",
    "scale": "the GPU scale tier (fmha.properties.scale): runs only with --fmha-scale, on a CUDA device",
    "cpu_tier": ("runs on the CPU whatever the session's device (eager mutants, plug-in sessions and CLIs on "
                 "--fmha-device cpu): the CPU tier's evidence; a CUDA session runs it only with --fmha-nightly"),
    "property": "hypothesis property test",
    "starts_first": ("long and bounded by a timeout or a subprocess, not by a kernel's work (a hang or a crash "
                     "isolated, a nested session, a compile for sm_90): starts at once, each on its own xdist "
                     "worker, never the tail of the run"),
    "regression": "named regression case from the trap library",
    "fmha_needs(*features)": "per-call contract features the test needs from the kernel (lse, out)",
    "fmha_suite": "a test outside fmha's packages whose `kernel`/`merge_kernel` arguments are the selected ones",
}


# What `--pyargs fmha` collects: the packages that hold fmha's tests.
SUITE_PACKAGES = ("fmha.oracles", "fmha.properties", "fmha.regressions")
KERNELS = pytest.StashKey[list]()
MERGES = pytest.StashKey[list]()
KNOWN_FAILURES = pytest.StashKey[tuple]()
REPLAYS = pytest.StashKey[tuple]()  # the profile's run_settings.Budget
QUARANTINE_TIMEOUT_S = 120  # the child's pytest-timeout: a case that hangs costs this, its compiles fit



def pytest_addoption(parser):
    group = parser.getgroup("fmha", "fmha kernel verification")
    selection.add_options(group.addoption)
    group.addoption("--fmha-merge", action="append", default=[], metavar="NAME|mutant:NAME|module:attr",
                    help="merge callable under test (repeatable); default: every registered merge")
    group.addoption("--fmha-known-failures", default=None, metavar="FILE",
                    help="a TOML file of known failures of your kernels (the ledger's records), run as strict xfails")
    group.addoption("--fmha-cases", action="append", default=[], metavar="DIR",
                    help="a directory of your own named cases (python -m fmha.regressions new ID --dir DIR), "
                         "run with fmha's (repeatable)")
    group.addoption("--fmha-activations", default=None, metavar="FILE",
                    help="q, k and v recorded from your model (torch.save({'q': q, 'k': k, 'v': v}), each (..., "
                         "tokens, heads, dim)): the draws' `recorded` distribution samples them (default: the "
                         "synthetic massive_activations)")
    group.addoption("--fmha-replay-env", action="append", default=[], metavar="NAME",
                    help="an environment variable your kernel is configured by (repeatable): judged calls replayed "
                         "in a clean child process (whose environment is an allowlist) get it too")
    group.addoption("--fmha-seed", type=int, default=None, metavar="N",
                    help="the run's seed, which every sample's values are drawn from (default: $FMHA_SEED, else a "
                         "fresh one, printed in the header and in every rerun command); 0 draws the values of runs "
                         "before seeds")
    group.addoption("--fmha-nightly", action="store_true", help="also run tests marked nightly, and the known "
                    "failures recorded as quarantined or at some seeds, each in child processes")
    group.addoption("--fmha-ignore-known-failures", action="store_true",
                    help="run every test as it is, no known-failure record applied (the nightly's children do)")
    group.addoption("--fmha-nightly-seeds", type=int, default=5, metavar="N",
                    help="with --fmha-nightly, the seeds a known failure recorded at some seeds runs at (default 5)")
    group.addoption("--fmha-slow", action="store_true", help="on the CPU, also run tests marked slow")
    group.addoption("--fmha-scale", action="store_true",
                    help="also run the GPU scale tier: each selected kernel on calls at production sizes (128k keys, "
                         "caches past 2^31 elements, 512 requests, page ids past 2^20; fmha.properties.scale)")
    group.addoption("--fmha-progress", type=float, default=None, metavar="SECONDS",
                    help="a progress line every SECONDS (default: 10 where the output is not a terminal; 0: none)")


def pytest_configure(config):
    from fmha.regressions import ledger

    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # Triton 3.6's interpreter takes int() of 1-element arrays for runtime loop bounds.
    config.addinivalue_line("filterwarnings", "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
    if config.getoption("pyargs") and "fmha" in config.args and not _suite_inside_fmha():
        # `--pyargs fmha` means the suite; after an editable install fmha/ is the checkout's
        # kernels folder and the suite's packages are beside it (a regular install puts them inside).
        at = config.args.index("fmha")
        config.args[at:at + 1] = SUITE_PACKAGES
    try:
        config.stash[DEVICE] = selection.device(config.getoption("--fmha-device"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from e
    workerinput = getattr(config, "workerinput", None)
    seed = config.getoption("--fmha-seed")
    if seed is None:  # a session started by a test of this one (pytester) draws at its seed
        seed = int(os.environ.get(run_seed.ENVIRONMENT) or run_seed.fresh())
    config.stash[RUN_SEED] = (workerinput or {}).get("fmha_seed", seed)
    run_seed.use(config.stash[RUN_SEED])
    os.environ[run_seed.ENVIRONMENT] = str(config.stash[RUN_SEED])
    # xdist starts one worker per core and torch one thread per core in each: 16 x 16 threads on
    # 16 cores slowed every CPU-bound test (compiles, oracles) on a GPU runner; a session on its
    # own takes the cores the machine's load leaves (fmha.oracles.threads)
    if workerinput is not None:
        threads.share_cores(int(workerinput["workercount"]))
    elif not getattr(config.option, "numprocesses", None):  # not an xdist controller, which only hands out tests
        threads.share_cores()
    else:  # before xdist starts the workers: they share one bytecode cache where Python writes none
        bytecode.share()
    known = ledger.LEDGER
    path = config.getoption("--fmha-known-failures")
    try:
        if path:
            known += ledger.load_known_failures(path)
        if config.getoption("--fmha-cases"):
            from fmha.regressions import traps

            traps.load_directories(str(config.invocation_params.dir / d) for d in config.getoption("--fmha-cases"))
        if config.getoption("--fmha-activations"):
            from fmha.oracles import distributions

            distributions.load_recorded(str(config.invocation_params.dir / config.getoption("--fmha-activations")))
        if config.getoption("--fmha-kernel") or config.getoption("--fmha-merge"):
            _selection(config)  # a bad name is a usage error now, not a collection error later
    except ValueError as e:
        raise pytest.UsageError(str(e)) from e
    config.stash[KNOWN_FAILURES] = known
    config.stash[REPLAYS] = replay_settings(config)
    if config.getoption("--fmha-replay-env"):
        from fmha.oracles import replay_child

        replay_child.KERNELS_ENVIRONMENT.update(config.getoption("--fmha-replay-env"))


def pytest_unconfigure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        bytecode.restore()


def _suite_inside_fmha() -> bool:
    import importlib.util

    inside = os.path.dirname(importlib.util.find_spec("fmha").origin)
    return all(os.path.dirname(importlib.util.find_spec(p).origin) == os.path.join(inside, p.split(".")[1])
               for p in SUITE_PACKAGES)


def pytest_sessionstart(session):
    progress.install(session.config)
    report = session.config.stash.get(junitxml.xml_key, None)  # --junitxml's (on xdist's controller)
    if report is not None:  # a green run's seed kept beside its results: its values can be drawn again
        report.add_global_property("fmha_seed", session.config.stash[RUN_SEED])


def _selection(config) -> tuple[list[KernelEntry], list]:
    """The selected kernels and merges, resolved on first use (the registry imports Triton,
    which a session without fmha tests does not need)."""
    if KERNELS not in config.stash:
        from fmha import registry

        specs = config.getoption("--fmha-kernel")
        config.stash[KERNELS] = selection.kernels(specs, config.stash[DEVICE])
        config.stash[KERNEL_SPECS] = {k.name: spec for k, spec in zip(config.stash[KERNELS], specs)}
        from fmha.oracles import replay_child

        replay_child.SPECS.update({k.name: config.stash[KERNEL_SPECS].get(k.name, k.name) for k in config.stash[KERNELS]})
        merges = [selection.resolve_merge(s) for s in config.getoption("--fmha-merge")]
        config.stash[MERGES] = merges or list(registry.MERGES.values())
    return config.stash[KERNELS], config.stash[MERGES]


def pytest_report_header(config):
    seed = f"seed {config.stash[RUN_SEED]} (--fmha-seed {config.stash[RUN_SEED]} draws these values again)"
    if not (config.getoption("--fmha-kernel") or config.getoption("--fmha-merge")):
        return f"fmha: device {config.stash[DEVICE]}; {seed}"
    kernels, merges = _selection(config)
    return (f"fmha: device {config.stash[DEVICE]}; kernels {', '.join(k.name for k in kernels)}; "
            f"merges {', '.join(m.name for m in merges)}; {seed}")


def _in_suite(metafunc) -> bool:
    """fmha's own tests (in fmha.oracles, .properties, .regressions), or tests marked
    `fmha_suite`: other tests of the session keep their own `kernel` arguments."""
    if metafunc.definition.get_closest_marker("fmha_suite"):
        return True
    import fmha.oracles
    import fmha.properties
    import fmha.regressions

    path = str(metafunc.definition.path)
    return any(path.startswith(os.path.dirname(package.__file__) + os.sep)
               for package in (fmha.oracles, fmha.properties, fmha.regressions))


def pytest_generate_tests(metafunc):
    if "scale_sample" in metafunc.fixturenames and _in_suite(metafunc):
        pairs, ids = _scale_calls(metafunc.config)
        metafunc.parametrize(["kernel", "scale_sample"], pairs, ids=ids)
        return
    if ("kernel" in metafunc.fixturenames or "merge_kernel" in metafunc.fixturenames) and _in_suite(metafunc):
        kernels, merges = _selection(metafunc.config)
        if "kernel" in metafunc.fixturenames:
            metafunc.parametrize("kernel", kernels, ids=[k.name for k in kernels])
        if "merge_kernel" in metafunc.fixturenames:
            metafunc.parametrize("merge_kernel", merges, ids=[m.name for m in merges])


def _scale_calls(config) -> tuple[list, list]:
    """(kernel, sample) of the GPU scale tier, and their ids: with --fmha-scale on CUDA every call
    of fmha.properties.scale a kernel's declaration admits; else a kernel each, its test skipped."""
    kernels, _ = _selection(config)
    device = config.stash[DEVICE]
    if not (config.getoption("--fmha-scale") and device == "cuda"):
        return [(k, None) for k in kernels], [k.name for k in kernels]
    from fmha.properties import scale

    pairs = [(k, s) for k in kernels for s in scale.calls(k, device)]
    return pairs, [f"{k.name}-{s.id}" for k, s in pairs]


def starts_first_order(items: list, config) -> list:
    """The long tests at the heads of different xdist workers' first batches, the rest in order.
    Long: `starts_first` tests, then the laws of fmha's own kernels (each draw a compile on a
    GPU with a cold cache, interpreted on a CPU: 20-60 s each on an H100). xdist's schedulers
    hand each worker a batch of consecutive tests first (worksteal: an equal share, and an idle
    worker takes the end of a busy one's): all of them at the front of the collection put them on
    the first worker one after the other, and in collection order the laws came last, so
    the last of them was a cold H100 run's tail (the laws of fmha started 90-160 s in, the run
    ended at 210 s). Under worksteal each batch heads with its share of the long tests, dealt in
    turn; under load scheduling, whose batches are small, one each."""
    from fmha.registry import OURS_NAMES

    def long(item):  # a skipped one takes no time: it would waste its worker's head
        if item.get_closest_marker("skip"):
            return None
        if item.get_closest_marker("starts_first"):
            return 0
        kernel = getattr(getattr(item, "callspec", None), "params", {}).get("kernel")
        return 1 if item.get_closest_marker("property") and getattr(kernel, "name", None) in OURS_NAMES else None

    rank = {item: long(item) for item in items}
    first = sorted((item for item in items if rank[item] is not None), key=rank.get)  # stable: in order within each
    rest = [item for item in items if rank[item] is None]
    workerinput = getattr(config, "workerinput", {})
    workers = int(workerinput.get("workercount", 1))
    if workers == 1 or not first:
        return first + rest
    worksteal = workerinput.get("fmha_dist") == "worksteal"
    if len(items) < 2 * workers:  # one test to each worker in turn
        batch = 1
    elif worksteal:
        batch = len(items) // workers
    else:  # xdist.scheduler.load.LoadScheduling.schedule
        batch = max(min(len(items) // workers // 4, workerinput.get("fmha_maxschedchunk") or len(items)), 2)
    heads = [first[worker::workers] if worksteal else first[worker:worker + 1] for worker in range(workers)]
    order = []
    for head in heads:
        taken = max(batch - len(head), 0)
        order += head + rest[:taken]
        del rest[:taken]
    placed = set(order)
    return order + [item for item in first if item not in placed] + rest


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """On the xdist controller: tell each worker how the tests will be scheduled (a worker's
    own `--dist` reads "no")."""
    node.workerinput["fmha_dist"] = node.config.getoption("dist")
    node.workerinput["fmha_maxschedchunk"] = node.config.getoption("maxschedchunk")
    node.workerinput["fmha_seed"] = node.config.stash[RUN_SEED]  # one run, one seed, on every worker


def case_id(params: dict) -> str:
    """The id a known-failure record's `case` is matched against: a named case's "trap/case", a
    sample's or a problem's id; "" for a test of no case (a law)."""
    if "trap" in params and "case" in params:
        return f"{params['trap'].id}/{params['case'].id}"
    sample = params.get("sample") or params.get("problem")
    return getattr(sample, "id", "") or ""


def pytest_collection_modifyitems(config, items):
    from fmha.regressions.ledger import known_failure

    device = config.stash[DEVICE]
    for item in items:
        if item.get_closest_marker("gpu") and device != "cuda":
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (running on cpu)"))
        if item.get_closest_marker("slow") and device == "cpu" and not config.getoption("--fmha-slow"):
            item.add_marker(pytest.mark.skip(reason="slow through the CPU interpreter: runs on GPUs, or pass --fmha-slow"))
        if item.get_closest_marker("nightly") and not config.getoption("--fmha-nightly"):
            item.add_marker(pytest.mark.skip(reason="nightly tier: pass --fmha-nightly to run it"))
        if item.get_closest_marker("scale") and not (config.getoption("--fmha-scale") and device == "cuda"):
            item.add_marker(pytest.mark.skip(reason="the GPU scale tier: runs on a CUDA device with --fmha-scale"))
        if item.get_closest_marker("cpu_tier") and device == "cuda" and not config.getoption("--fmha-nightly"):
            item.add_marker(pytest.mark.skip(reason="runs on the CPU whatever the device: the CPU tier's test; a CUDA "
                                                    "session runs it with --fmha-nightly"))
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params:
            continue
        if "merge_kernel" in params:
            reasons = params["merge_kernel"].not_supported_reasons(device)
            if reasons:
                item.add_marker(pytest.mark.skip(reason=f"{params['merge_kernel'].name}: {'; '.join(reasons)}"))
        kernel = params.get("kernel")
        if kernel is None:
            continue
        record = known_failure(config.stash[KNOWN_FAILURES], kernel.name, item.originalname, device, case_id(params))
        if record and config.getoption("--fmha-ignore-known-failures"):
            record = None  # the isolated child of a nightly run: its outcome as it is
        if record:
            # The nightly runs a quarantined case in a child, and a some-seeds one at several seeds
            # (children too): a fix is seen either way.
            isolated = config.getoption("--fmha-nightly") and (record.quarantine or record.seeds == "some")
            if isolated:
                seeds = config.getoption("--fmha-nightly-seeds") if record.seeds == "some" else 1
                item.obj = run_isolated(item, [config.stash[RUN_SEED] + i for i in range(seeds)])
            launched = ("[run in a child process, nightly]" if isolated
                        else "[quarantined: not launched]" if record.quarantine else "")
            item.add_marker(pytest.mark.xfail(strict=record.seeds == "every" or isolated,
                                              run=not record.quarantine or isolated,
                                              reason=f"known failure ({record.issue}): {record.reason} [the record: "
                                                     f"{record.identity}; passing, it is to be removed or narrowed] "
                                                     f"{launched}".rstrip()))
        problem = params.get("problem") or getattr(params.get("sample"), "problem", None)
        if not isinstance(problem, Problem):
            continue
        needs = [f for marker in item.iter_markers("fmha_needs") for f in marker.args]
        reasons = kernel.not_supported_reasons(problem, device, needs)
        if reasons:
            item.add_marker(pytest.mark.skip(reason=f"{kernel.name}: {'; '.join(reasons)}"))
    items[:] = starts_first_order(items, config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The test draws under the run's seed mixed with its kernel's name: two kernels of one run
    never see the same bytes."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    under_test = params.get("kernel", params.get("merge_kernel"))
    seed = item.config.stash[RUN_SEED]
    run_seed.use(seed if under_test is None else run_seed.for_kernel(seed, getattr(under_test, "name", under_test)))
    if under_test is not None or "fmha.oracles.production" in sys.modules:  # a session of other tests imports none
        from fmha.oracles import production

        production.start_of_test(f"{seed}/{item.nodeid}", **item.config.stash[REPLAYS]._asdict())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """An output a kernel returned in this test that changed after it was judged fails the test
    (fmha.oracles.guard keeps their bytes)."""
    guard = sys.modules.get("fmha.oracles.guard")
    try:
        result = yield
    except BaseException:
        if guard is not None:
            guard.end_of_test()
        raise
    changed = guard.end_of_test() if guard is not None else []
    if changed:
        raise AssertionError("the judge refuses this test's calls: " + "; ".join(changed))
    return result


def run_isolated(item, seeds: list[int]):
    """The body of a known failure's test under --fmha-nightly, quarantined (it hangs or kills
    its process) or failing at some seeds only: the test alone in a child pytest at each of
    `seeds`, bounded, the ledger ignored. Passing at every one is the record's XPASS (it is to be
    removed or narrowed); otherwise its xfail says at how many seeds it failed and how."""
    from fmha.regressions.isolation import describe_exit

    rerun = shlex.split(reproduce_command(item))
    at = rerun.index("--fmha-seed")
    del rerun[at:at + 2]

    def body(**_fixtures):
        children = {seed: subprocess.Popen(  # side by side: each is one test, mostly its process's start
            [sys.executable, "-m", *rerun, "--fmha-seed", str(seed), "-p", "no:cacheprovider", "-q", "--tb=line",
             "--fmha-ignore-known-failures", f"--timeout={QUARANTINE_TIMEOUT_S}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for seed in seeds}
        failed = []
        for seed, child in children.items():
            try:
                output, _ = child.communicate(timeout=QUARANTINE_TIMEOUT_S + 300)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                failed.append(f"seed {seed}: its child ran past {QUARANTINE_TIMEOUT_S + 300} s")
                continue
            if child.returncode != 0:
                lines = output.strip().splitlines()
                said = next((line for line in lines if "Error" in line or line.startswith("E ")), " | ".join(lines[-3:]))
                failed.append(f"seed {seed}: {describe_exit(child.returncode)}: {said[-300:]}")
        if failed:
            pytest.xfail(f"fails in a child process at {len(failed)} of {len(seeds)} seed(s): {failed[0]}")

    return body


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A valid call the kernel refuses (NotSupportedError) is a skip carrying its reason."""
    try:
        return (yield)
    except NotSupportedError as e:
        kernel = getattr(pyfuncitem, "callspec", None) and pyfuncitem.callspec.params.get("kernel")
        pytest.skip(f"{kernel.name if kernel else 'the kernel'} raised NotSupportedError: {e}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and call.when == "call" and "kernel" in getattr(getattr(item, "callspec", None), "params", {}):
        report.sections.append(("fmha: reproduce", reproduce_command(item)))
    return report


@pytest.fixture(scope="session")
def device(request) -> str:
    return request.config.stash[DEVICE]
