"""Plugging kernels in with --fmha-kernel: a correct one passes the agreement suite; four
with classic bugs each fail it with a message that names the bug.

The kernels are throwaway plug-in modules written here, not product code.
"""

import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_tier  # plug-in sessions on --fmha-device cpu: nightly on CUDA

pytest_plugins = ["pytester"]

AGREEMENT = str(Path(__file__).resolve().parents[1] / "properties" / "test_agreement.py")

PLUGGED = textwrap.dedent('''
    import math
    import torch

    def _attend(q, k, v, scale, causal, window, sink, top_left=False, dots=None):
        B, T, H, D = q.shape
        S, group = k.shape[1], H // k.shape[2]
        keys = k.float().repeat_interleave(group, 2)
        values = v.float().repeat_interleave(group, 2)
        dots = torch.einsum("bthd,bshd->bhts", q.float(), keys) if dots is None else dots.float()
        s = dots * (D ** -0.5 if scale is None else scale)
        row = torch.arange(T)[:, None] + (0 if top_left else S - T)
        col = torch.arange(S)[None, :]
        visible = torch.ones(T, S, dtype=torch.bool)
        if causal or window:
            visible &= col <= row
        if window:
            visible &= col > row - window
        s = s.masked_fill(~visible, -math.inf)
        if sink is not None:
            s = torch.cat([s, sink.view(1, -1, 1, 1).expand(B, H, T, 1)], dim=-1)
        m = s.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
        unnormalized = torch.exp(s - m)
        row_sum = unnormalized.sum(-1, keepdim=True)
        p = (unnormalized / row_sum.clamp(min=1e-30))[..., :S]
        lse = (m + row_sum.log()).squeeze(-1)
        return p, values, lse, row_sum

    def _finish(o, q, out):
        o = o.to(q.dtype)
        if out is None:
            return o
        out.copy_(o)
        return out

    def correct(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, dots=None):
        p, values, lse, _ = _attend(q, k, v, scale, causal, window, sink, dots=dots)
        return _finish(torch.einsum("bhts,bshd->bthd", p, values), q, out), lse

    def top_left(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        p, values, lse, _ = _attend(q, k, v, scale, causal, window, sink, top_left=True)
        return _finish(torch.einsum("bhts,bshd->bthd", p, values), q, out), lse

    def base2_lse(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        o, lse = correct(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out)
        return o, lse / math.log(2)

    def normalize_twice(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        p, values, lse, row_sum = _attend(q, k, v, scale, causal, window, sink)
        o = torch.einsum("bhts,bshd->bthd", p, values) / row_sum.squeeze(-1).transpose(1, 2)[..., None]
        return _finish(o, q, out), lse

    def unwritten_row(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        o, lse = correct(q, k, v, scale=scale, causal=causal, window=window, sink=sink)
        out = torch.empty_like(o) if out is None else out
        out[:, :-1] = o[:, :-1]  # the last query row is never stored
        return out, lse

    def ignores_scale(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        return correct(q, k, v, causal=causal, window=window, sink=sink, out=out)  # always D ** -0.5

    def _dense(t):
        """t's memory read as if it were a dense tensor of t's shape: what a kernel that takes
        the data pointer and computes its own strides sees."""
        strides = torch.empty(t.shape, device="meta").stride()
        return torch.as_strided(t, t.shape, strides, t.storage_offset())

    def assumes_contiguous(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        return correct(q, _dense(k), _dense(v), scale=scale, causal=causal, window=window, sink=sink, out=out)

    def dv_bug_on_decode(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        o, lse = correct(q, k, v, scale=scale, causal=causal, window=window, sink=sink)
        if q.shape[1] == 1:  # the decode path sizes its accumulator by D, not Dv
            D = q.shape[-1]
            o = torch.nn.functional.pad(o[..., :D], (0, max(0, o.shape[-1] - D)))
        return _finish(o, q, out), lse

    def _tf32(t):
        """fp32 with the low 13 mantissa bits dropped, as a TF32 matmul unit reads it."""
        return (t.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32) if t.dtype == torch.float32 else t

    def tf32(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        return correct(_tf32(q), _tf32(k), _tf32(v), scale=scale, causal=causal, window=window, sink=sink, out=out)

    def fp16_accumulation(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        """q.k summed 16 head dims at a time into an fp16 accumulator, as an fp16-accumulating MMA."""
        group = q.shape[2] // k.shape[2]
        keys = k.float().repeat_interleave(group, 2)
        dots = torch.zeros(q.shape[0], q.shape[2], q.shape[1], k.shape[1], dtype=torch.float16)
        for c in range(0, q.shape[-1], 16):
            dots = (dots.float() + torch.einsum("bthd,bshd->bhts", q[..., c:c + 16].float(), keys[..., c:c + 16])).half()
        # the rest in fp32, from logits rebuilt as q'.k with the accumulated dot products
        o, lse = correct(q.float(), k.float(), v, scale=scale, causal=causal, window=window, sink=sink, dots=dots)
        return _finish(o, q, out), lse
''')

# One causal GQA prefill with T < S, in bf16: enough to expose each bug.
CASE = "hd64-T32-S256-gqa4-h8-causal-bf16"


@pytest.fixture
def plugged(pytester):
    pytester.makepyfile(plugged_kernels=PLUGGED)
    pytester.syspathinsert()
    return pytester


def _run(pytester, plugin, *args):
    return pytester.runpytest(AGREEMENT, "-p", "no:cacheprovider", "-p", "no:randomly",
                              f"--fmha-kernel=plugged_kernels:{plugin}", "--fmha-device=cpu", *args)


def test_a_correct_plugged_kernel_passes_every_case(plugged):
    result = _run(plugged, "correct")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("skipped", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes["passed"] >= 81


@pytest.mark.parametrize(
    "plugin, named",
    [
        ("top_left", "output matches top-left causal alignment"),
        ("base2_lse", "base-2 LSE"),
        ("normalize_twice", "normalised twice"),
        ("unwritten_row", "still hold the NaN poison"),
    ],
)
def test_a_buggy_plugged_kernel_fails_naming_its_bug(plugged, plugin, named):
    result = _run(plugged, plugin, "-k", CASE)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, result.stdout.str()[-3000:]
    assert named in result.stdout.str(), result.stdout.str()[-3000:]
    assert "pin it: Sample(problem=Problem(" in result.stdout.str(), result.stdout.str()[-3000:]


@pytest.mark.parametrize(
    "plugin, selection, named",
    [
        ("ignores_scale", "scale0.3 and bf16-normal", "the scale argument ignored"),
        ("assumes_contiguous", "k.strided and bf16-normal", "mishandles non-contiguous storage"),
        ("dv_bug_on_decode", "dv128-T1 and bf16-normal", "mishandles Dv != D on the decode path"),
        ("tf32", "hd64-T4-S128-B2-mha-h4-fp32-normal", "fp32 inputs computed at TF32 precision"),
        ("fp16_accumulation", "hd64-T32-S256-gqa4-h8-causal-fp16", "q.k accumulated or held in 16 bits"),
    ],
    ids=["ignores-scale", "assumes-contiguous", "dv-on-decode", "tf32", "fp16-accumulation"],
)
def test_a_plugged_kernel_with_a_hidden_dimension_bug_fails_naming_it(plugged, plugin, selection, named):
    """Each bug passes every sample that does not vary its dimension: the agreement cases draw
    a scale, K and V in their own storage, Dv != D at T = 1, and fp32 inputs."""
    result = _run(plugged, plugin, "-k", selection)
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed", 0) >= 1, out[-3000:]
    assert named in out, out[-3000:]


def test_an_unknown_kernel_name_is_a_usage_error(plugged):
    result = plugged.runpytest(AGREEMENT, "--fmha-kernel=no-such-kernel")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown name; registered: fmha, triton, gluon, gluon-sparse, cuda-sparse, sdpa-math" in result.stderr.str()


def test_a_missing_attribute_is_a_usage_error(plugged):
    result = plugged.runpytest(AGREEMENT, "--fmha-kernel=plugged_kernels:nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "module 'plugged_kernels' has no attribute 'nope'" in result.stderr.str()


def test_a_plugin_that_does_not_compile_is_a_usage_error_naming_the_line(plugged):
    plugged.makepyfile(broken_kernels="def fwd(q, k, v,\n    return q\n")
    result = plugged.runpytest(AGREEMENT, "--fmha-kernel=broken_kernels:fwd")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "INTERNALERROR" not in result.stdout.str() + err
    assert "'broken_kernels' does not compile" in err and "broken_kernels.py, line 1" in err, err


MISTAKES = textwrap.dedent('''
    from plugged_kernels import correct

    def as_dict(*args, **kwargs):
        return correct(*args, **kwargs)

    as_dict.capabilities = {"head_dims": (64,), "dtypes": ("bf16",)}

    def no_scale(q, k, v, causal=False):
        return correct(q, k, v, causal=causal)

    def paged(q, k, v, *, block_table, kv_lens, scale=None, causal=False, window=None, sink=None, out=None):
        raise AssertionError("never called: its declaration says dense")
''')


@pytest.mark.parametrize("attr, said", [
    ("as_dict", "its capabilities attribute is a dict; expected an fmha.Capabilities (fmha.Capabilities(**that dict) "
                "is one)"),
    ("no_scale", "no_scale(q, k, v, causal=False) cannot take a dense call, fn(q, k, v, scale=..., causal=..., "
                 "window=..., sink=..., out=...): got an unexpected keyword argument 'scale'"),
    ("paged", "missing a required argument: 'block_table'; block_table, kv_lens come with paged or ragged calls: "
              "declare the sources it takes, fn.capabilities = fmha.Capabilities(sources=frozenset({'paged'}), ...) "
              "(it declares dense)"),
], ids=["capabilities-as-a-dict", "a-signature-without-scale", "paged-arguments-undeclared"])
def test_a_plugin_the_contract_cannot_call_is_a_usage_error_saying_what_to_change(plugged, attr, said):
    """A declaration that is not a Capabilities, a signature that cannot take the calls of the sources
    it declares: one paragraph naming the attribute, what was expected and the fix, before any test
    runs; no INTERNALERROR, no traceback through the guard."""
    plugged.makepyfile(mistaken_kernels=MISTAKES)
    result = plugged.runpytest(AGREEMENT, f"--fmha-kernel=mistaken_kernels:{attr}")
    err, out = result.stderr.str(), result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out[-2000:] + err[-2000:]
    assert f"--fmha-kernel 'mistaken_kernels:{attr}': " in err and said in err, err
    assert "INTERNALERROR" not in out + err and "Traceback" not in out + err, out[-2000:] + err[-2000:]


@pytest.mark.parametrize("returns, said", [
    ("o, lse, 0", "expected (o, lse) with lse a tensor or None, got a tuple of 3: (Tensor, Tensor, int)"),
    ("o, None", "declares lse (Capabilities.features) but returned (o, None): return the (2, 4, 4) float32 "
                "log-sum-exp, or leave lse out of its features"),
    ("o, lse.to(torch.bfloat16)", "lse should be (2, 4, 4) torch.float32 (the contract's: log Z per row, natural "
                                  "log), got (2, 4, 4) torch.bfloat16"),
], ids=["three-outputs", "lse-declared-not-returned", "lse-in-bf16"])
def test_outputs_unlike_the_declared_ones_fail_by_name(plugged, returns, said):
    """The outputs checked as declared, before their values: a third output, an LSE declared and not
    returned (it had passed everything), an LSE in bf16 (judged on its accuracy alone)."""
    plugged.makepyfile(returning_kernels=textwrap.dedent(f'''
        import torch
        from plugged_kernels import correct

        def fwd(q, k, v, **kwargs):
            o, lse = correct(q, k, v, **kwargs)
            return {returns}
    '''))
    result = plugged.runpytest(AGREEMENT, "--fmha-kernel=returning_kernels:fwd", "-k", "hd64-T4-S128-B2-mha-h4-bf16-normal]")
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed", 0) == 1 and said in out, out[-3000:]
    assert "guard.py" not in out and "kernel_call.py" not in out, out[-3000:]  # the judge's frames hidden


def test_a_kernel_that_raises_shows_its_own_frames_and_not_the_judges(plugged):
    plugged.makepyfile(view_mistake_kernels=textwrap.dedent('''
        def fwd(q, k, v, **kwargs):
            return q.view(-1, 7)  # the author's mistake
    '''))
    result = plugged.runpytest(AGREEMENT, "--fmha-kernel=view_mistake_kernels:fwd", "-k", "hd64-T4-S128-B2-mha-h4-bf16-normal]")
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed", 0) == 1, out[-3000:]
    assert "return q.view(-1, 7)  # the author's mistake" in out and "view_mistake_kernels.py:2: RuntimeError" in out, out[-3000:]
    assert "guard.py" not in out and "kernel_call.py" not in out, out[-3000:]


def test_unsupported_combinations_are_skips_carrying_the_kernels_reason(plugged):
    plugged.makepyfile(limited_kernels=textwrap.dedent('''
        from fmha.contract import Capabilities
        from plugged_kernels import correct

        def limited(*args, **kwargs):
            return correct(*args, **kwargs)

        limited.capabilities = Capabilities(
            head_dims=(64,), features=frozenset({"causal", "lse"}), notes={"head_dim": "one tile shape"})
    '''))
    result = plugged.runpytest(AGREEMENT, "-p", "no:cacheprovider", "-rs",
                               "--fmha-kernel=limited_kernels:limited", "--fmha-device=cpu")
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] > 0 and outcomes["skipped"] > 0, out[-3000:]
    assert "limited_kernels:limited: head dim D=128 unsupported (supports [64]) (one tile shape)" in out
    assert "limited_kernels:limited: no gqa support; no sink support" in out


TRAPS = str(Path(__file__).resolve().parents[1] / "regressions" / "test_traps.py")


def test_a_quarantined_configuration_is_reported_without_being_launched(plugged):
    """A kernel that kills its process on a case is recorded in the ledger with quarantine:
    the case is reported xfail and never launched, so the run survives."""
    plugged.makepyfile(crashing_kernels=textwrap.dedent('''
        import os

        def aborts(*args, **kwargs):
            os.abort()
    '''), quarantine_record=textwrap.dedent('''
        from fmha.regressions import ledger

        ledger.LEDGER += (ledger.KnownFailure(
            "crashing_kernels:aborts", "test_named_regression_case", "aborts the process", "fmha issue 5",
            case="missing-scale/*", quarantine=True),)
    '''))
    result = plugged.runpytest_subprocess(TRAPS, "-p", "no:cacheprovider", "-p", "quarantine_record", "-rx",
                                          "-k", "missing-scale and bf16", "--fmha-kernel=crashing_kernels:aborts",
                                          "--fmha-device=cpu")
    result.assert_outcomes(xfailed=2)
    assert "[quarantined: not launched]" in result.stdout.str()


def test_the_nightly_runs_quarantined_and_some_seeds_records_and_reports_a_fixed_one(plugged, monkeypatch):
    from fmha.regressions import ledger

    """Under --fmha-nightly a quarantined case runs alone in a child process, and one recorded as
    failing at some seeds runs at several (children too): a kernel that fails at one of two seeds
    is its xfail, saying so; a quarantined one that passes now is an XPASS(strict) naming the
    record."""
    plugged.makepyfile(quarantined_kernels=textwrap.dedent('''
        import os

        from plugged_kernels import correct

        fixed = correct

        def at_odd_seeds(*args, **kwargs):  # the run's seed, as the plug-in sets it for the session
            if int(os.environ["FMHA_SEED"]) % 2:
                raise RuntimeError("fails at odd seeds")
            return correct(*args, **kwargs)
    '''))
    monkeypatch.setattr(ledger, "LEDGER", ledger.LEDGER + (  # the session runs in this process
        ledger.KnownFailure("quarantined_kernels:fixed", "test_named_regression_case", "aborted", "fmha issue 5",
                            case="missing-scale/*", quarantine=True),
        ledger.KnownFailure("quarantined_kernels:at_odd_seeds", "test_named_regression_case", "odd seeds",
                            "fmha issue 5", case="missing-scale/*", seeds="some")))
    result = plugged.runpytest(TRAPS, "-p", "no:cacheprovider", "-rxX", "-k", "missing-scale and bf16-normal",
                               "--fmha-device=cpu", "--fmha-nightly", "--fmha-kernel=quarantined_kernels:fixed",
                               "--fmha-kernel=quarantined_kernels:at_odd_seeds", "--fmha-nightly-seeds=2")
    result.assert_outcomes(xfailed=1, failed=1)
    out = result.stdout.str()
    assert "fails in a child process at 1 of 2 seed(s)" in out and "RuntimeError: fails at odd seeds" in out, out
    assert "XPASS(strict)" in out and "kernel 'quarantined_kernels:fixed', test 'test_named_regression_case', case " \
        "'missing-scale/*'" in out, out[-3000:]


LAWS = str(Path(__file__).resolve().parents[1] / "properties" / "test_laws.py")


def test_a_not_supported_error_at_call_time_is_a_skip_with_its_text(plugged):
    plugged.makepyfile(refusing_kernels=textwrap.dedent('''
        from fmha import NotSupportedError
        from plugged_kernels import correct

        def fwd(q, k, v, **kwargs):
            if q.shape[-1] == 256:
                raise NotSupportedError("head dim 256 lands next release")
            return correct(q, k, v, **kwargs)

        def never(q, k, v, **kwargs):
            raise NotSupportedError("nothing yet")
    '''))
    result = plugged.runpytest(AGREEMENT, "-p", "no:cacheprovider", "-rs", "--fmha-kernel=refusing_kernels:fwd",
                               "--fmha-device=cpu", "-k", "bf16-normal")
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["skipped"] == 1 and outcomes["passed"] > 0, out[-3000:]
    assert "refusing_kernels:fwd raised NotSupportedError: head dim 256 lands next release" in out, out[-3000:]
    laws = plugged.runpytest(LAWS, "-p", "no:cacheprovider", "-rs", "--fmha-kernel=refusing_kernels:never",
                             "--fmha-device=cpu", "-k", "test_agrees_with_the_oracle")
    assert laws.parseoutcomes().get("skipped") == 1, laws.stdout.str()[-3000:]
    assert "the kernel refused the samples it was given (NotSupportedError): nothing yet" in laws.stdout.str()


def test_a_users_known_failure_file_marks_strict_xfails_and_a_bad_one_is_a_usage_error(plugged):
    plugged.makefile(".toml", known=textwrap.dedent('''
        [[known_failure]]
        kernel = "plugged_kernels:ignores_scale"
        test = "test_kernel_matches_oracle"
        reason = "the scale argument is not wired through yet"
        issue = "mykernel#7"
        case = "*-normal-scale0.3"
    '''), broad=textwrap.dedent('''
        [[known_failure]]
        kernel = "plugged_kernels:ignores_scale"
        test = "test_kernel_matches_oracle"
        reason = "the scale argument is not wired through yet"
        issue = "mykernel#7"
        case = "*-scale0.3"
    '''), misnamed=textwrap.dedent('''
        [[known_failure]]
        kernel = "plugged_kernels:ignores_scale"
        test = "test_kernel_matches_the_oracle"
        reason = "x"
        issue = "x"
    '''), typo=textwrap.dedent('''
        [[known_failure]]
        kernel = "plugged_kernels:ignores_scale"
        test = "test_kernel_matches_oracle"
        reason = "x"
        issue = "x"
        cases = "scale0.3"
    '''))
    result = _run(plugged, "ignores_scale", "--fmha-known-failures=known.toml", "-k", "bf16-normal", "-rx")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["xfailed"] == 1, result.stdout.str()[-3000:]
    assert "known failure (mykernel#7): the scale argument is not wired through yet" in result.stdout.str()
    # strict: a record that also covers a case the kernel passes (constant scores do not
    # depend on the scale) fails that case as an unexpected pass
    broad = _run(plugged, "ignores_scale", "--fmha-known-failures=broad.toml", "-k", "bf16")
    assert broad.parseoutcomes().get("failed") == 1 and "XPASS(strict)" in broad.stdout.str()
    # a failure that shows only at some run seeds: the pass is reported, not failed
    (plugged.path / "some_seeds.toml").write_text((plugged.path / "broad.toml").read_text() + '\nseeds = "some"\n')
    some = _run(plugged, "ignores_scale", "--fmha-known-failures=some_seeds.toml", "-k", "bf16")
    assert not some.parseoutcomes().get("failed") and some.parseoutcomes().get("xpassed") == 1, some.stdout.str()[-2000:]
    typo = _run(plugged, "ignores_scale", "--fmha-known-failures=typo.toml")
    assert typo.ret == pytest.ExitCode.USAGE_ERROR
    assert "typo.toml: record 1: unknown field(s) ['cases']" in typo.stderr.str()
    misnamed = _run(plugged, "ignores_scale", "--fmha-known-failures=misnamed.toml")
    assert misnamed.ret == pytest.ExitCode.USAGE_ERROR
    assert ("record 1: test 'test_kernel_matches_the_oracle' names no test of fmha's suite, so it would never apply; "
            "did you mean test_kernel_matches_oracle" in misnamed.stderr.str()), misnamed.stderr.str()


def test_pyargs_fmha_collects_the_suite_whatever_the_install(plugged):
    """`--pyargs fmha` names the package; after an editable install (CI's) its folder is the
    checkout's fmha/, which holds no tests: the plugin reads it as the suite's packages."""
    result = plugged.runpytest_subprocess("--pyargs", "fmha", "--fmha-kernel=plugged_kernels:correct",
                                          "--fmha-device=cpu", "--collect-only", "-q", "-p", "no:cacheprovider")
    ids = result.stdout.str()
    for test in ("test_laws.py::test_agrees_with_the_oracle[plugged_kernels:correct]",
                 "test_grid.py::test_grid_config_matches_oracle[plugged_kernels:correct-",
                 "test_traps.py::test_named_regression_case[plugged_kernels:correct-",
                 "test_verdict.py::"):
        assert test in ids, f"{test} not collected:\n{ids[-3000:]}"


def test_a_finding_in_another_library_names_its_version_and_kind():
    from fmha.regressions.ledger import LEDGER, KnownFailure

    with pytest.raises(ValueError, match="KnownFailure.version: a finding in another library names the version"):
        KnownFailure("flashmla", "test_named_regression_case", "NaN", "issue 31", kind="bug")
    with pytest.raises(ValueError, match="KnownFailure.kind: expected one of"):
        KnownFailure("flashmla", "test_named_regression_case", "NaN", "issue 31", kind="maybe", version="1.0")
    libraries = [r for r in LEDGER if r.kernel in ("flashmla", "flashinfer-decode")]
    assert libraries and all(r.kind and r.version and r.evidence for r in libraries)
