"""`python -m fmha.ci.nightly` on the CPU slice: the dense grid and the DSV4 sparse-decode
grid; a kernel that raises on some configs gets those runs recorded with the error, the gate
goes on, writes every report and exits 1."""

import json
import textwrap
from html.parser import HTMLParser
from xml.etree import ElementTree as ET

import pytest
import torch

from fmha.ci.run_record import RunRecord

pytestmark = pytest.mark.cpu_tier  # the gate on --fmha-device cpu: nightly on CUDA
pytest_plugins = ["pytester"]

RAISING = textwrap.dedent('''
    from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, reference

    def fwd(q, k, v, **kwargs):  # the float64 reference: every run it returns is at the gate
        if q.shape[-1] == 256:
            raise RuntimeError("no kernel for head dim 256 yet")
        return reference(q, k, v, **kwargs)

    fwd.capabilities = REFERENCE
''')


def _gate(out, *head_dims) -> int:
    """The gate's command in this process (its runs in its child, as from a shell)."""
    from fmha.ci import nightly

    return nightly.main(["--fmha-device", "cpu", "--fmha-kernel", "raising_kernels:fwd", "--head-dims", *head_dims,
                         "--out", str(out)])


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    """A kernel author's directory: the current one, its modules importable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


class _Page(HTMLParser):
    """The page as a reader sees it: its text, its images and the text of each element by id."""

    def __init__(self):
        super().__init__()
        self.text, self.images, self.by_id, self._open = [], [], {}, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        self._open.append(attrs.get("id"))
        if attrs.get("id"):
            self.by_id[attrs["id"]] = ""

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        self.text.append(data)
        for element in filter(None, self._open):
            self.by_id[element] += data


def test_the_gate_runs_both_grids_and_survives_a_kernel_that_raises(in_tmp_path, capsys):
    tmp_path = in_tmp_path
    (tmp_path / "raising_kernels.py").write_text(RAISING)
    out = tmp_path / "report"
    assert _gate(out, "256", "512") == 1, capsys.readouterr().out[-3000:]
    records = json.loads((out / "results.json").read_text())["records"]
    assert {RunRecord.from_json(r).part for r in records} == {"gate"}  # verify's record too
    sparse = [r for r in records if r["where"]["layout"] == "dsv4-sparse"]
    assert len(sparse) == 2 * 3 and all(r["outcome"] == "passed" and r["metrics"]["cos"] >= 0.999998
                                        for r in sparse), sparse
    raised = [r for r in records if r["outcome"] == "raised"]
    # 4 configs x 3 layouts x 3 dtypes, each in one distribution: the CPU slice's rotation
    assert raised and all(r["where"]["head_dim"] == 256 for r in raised) and len(raised) == 4 * 3 * 3
    dense = [r for r in records if r["where"]["layout"] != "dsv4-sparse"]
    for key in ("layout", "dtype"):  # every layout and every dtype meets every distribution
        met = {(r["where"][key] if key == "layout" else r["dtype"], r["where"]["distribution"]) for r in dense}
        assert len(met) == 3 * 3, sorted(met)
    assert all("RuntimeError: no kernel for head dim 256 yet" in r["message"] for r in raised)
    assert all(r["outcome"] == "passed" for r in records if r["where"]["head_dim"] != 256)
    assert {r["where"]["head_dim"] for r in records} == {256, 512}
    summary = (out / "summary.md").read_text()
    assert "raised RuntimeError: no kernel for head dim 256 yet" in summary and "2 DSV4 sparse-decode configs" in summary
    assert (out / "index.html").exists()
    for name in ("results.json", "summary.md", "index.html"):  # served to whoever reads the CI's artefacts
        assert (out / name).stat().st_mode & 0o044 == 0o044, f"{name} is not readable by group and others"

    # the page: the threshold, the verdict, the failing configs and both grids' heatmaps
    page = _read_page(out)
    text = "".join(page.text)
    assert "0.999998" in page.by_id["threshold"] and page.by_id["verdict"].strip().startswith("FAILED"), page.by_id
    assert "hd256-T1-S128" in page.by_id["failing"] and "raised RuntimeError: no kernel for head dim 256" in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith(("# ", "## ", "- ", "```"))], text
    assert [image["src"] for image in page.images if image["class"] == "heatmap"] == [
        "heatmap-raising_kernels-fwd.png", "heatmap-raising_kernels-fwd-sparse.png"]
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite.get("name") == "raising_kernels:fwd" and int(suite.get("failures")) == 4, ET.tostring(suite)[:500]
    # a second night: a trend line over both
    assert _gate(out, "256") == 1
    assert len((out / "history.jsonl").read_text().splitlines()) == 2
    (trend,) = [image["src"] for image in _read_page(out).images if image["class"] == "trend"]
    assert (out / trend).read_bytes()[:4] == b"\x89PNG"
    for image in page.images:
        assert (out / image["src"]).read_bytes()[:4] == b"\x89PNG", image


def _read_page(out) -> _Page:
    page = _Page()
    page.feed((out / "index.html").read_text())
    return page


def test_by_default_the_gate_judges_fmha_and_compared_kernels_never_fail_it(in_tmp_path, capsys):
    """SDPA's flash kernel is below the gate by design (fp32 accumulation, bf16 P): compared,
    its rows are in the report and the exit status is fmha's."""
    from fmha.ci import nightly

    out = in_tmp_path / "report"
    status = nightly.main(["--fmha-device", "cpu", "--head-dims", "64", "--compare", "sdpa-flash", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed[-3000:]
    records = json.loads((out / "results.json").read_text())["records"]
    assert {(r["kernel"], r["gated"]) for r in records} == {("fmha", True), ("sdpa-flash", False)}
    assert any(r["outcome"] == "failed" for r in records if r["kernel"] == "sdpa-flash"), "the comparison shows nothing"
    assert "sdpa-flash (compared, not gated)" in printed
    page = _read_page(out)
    assert page.by_id["verdict"].strip().startswith("PASSED"), page.by_id["verdict"]
    suites = {s.get("name"): s for s in ET.parse(out / "junit.xml").getroot().iter("testsuite")}
    assert suites["sdpa-flash"].get("failures") == "0" and suites["fmha"].get("failures") == "0"


BLANK = textwrap.dedent('''
    from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, reference

    def nan(q, k, v, *, out=None, **kwargs):  # the reference's answer, every element then NaN
        o, lse = reference(q, k, v, out=out, **kwargs)
        return o.fill_(float("nan")), lse

    def unwritten(q, k, v, *, out=None, **kwargs):  # computes the answer, never writes it into out=
        o, lse = reference(q, k, v, **kwargs)
        return (o if out is None else out), lse

    nan.capabilities = unwritten.capabilities = REFERENCE
''')


def test_an_output_of_nan_or_never_written_is_below_the_gate(tmp_path, monkeypatch):
    """The cosine leaves NaN, inf and unwritten elements out (they are reported apart): an
    output made of nothing else has cosine 1 and must fail the run all the same."""
    from fmha import registry
    from fmha.ci import nightly, report_html
    from fmha.properties.grid import GRID

    (tmp_path / "blank_kernels.py").write_text(BLANK)
    monkeypatch.syspath_prepend(str(tmp_path))
    kernels = [registry.resolve_kernel(f"blank_kernels:{name}") for name in ("nan", "unwritten")]
    configs = [c for c in GRID if (c.head_dim, c.q_len, c.kv_len) == (64, 1, 128)]
    records = nightly.run_gate(kernels, "cpu", 1, nightly.cases(configs, []), progress=False)
    assert records and all(r.returned and r.outcome == "failed" for r in records), records
    assert {r.kernel: r.metrics["cos"] for r in records} == {"blank_kernels:nan": 1.0, "blank_kernels:unwritten": 1.0}
    summary, failing = nightly.summarize(records, None, "# night")
    assert failing and "NaN or inf output elements" in summary and "unwritten output elements" in summary, summary
    assert all(report_html.worst_by_cell(t.runs)[("hd64 T=1", "S=128")] == 1.0 for t in nightly.tally(records).values())


def test_a_gqa_head_mapping_bug_fails_the_gate_in_every_dtype_the_kernel_declares():
    """The grid's GQA layout, in each declared dtype: a kernel reading KV head h % Hkv (right for
    MHA and MQA) fails those runs alone; a dtype it does not declare is a skip with its reason."""
    import dataclasses

    from fmha.ci import nightly
    from fmha.properties.grid import GRID
    from fmha.regressions.selection import resolve_kernel

    mutant = resolve_kernel("mutant:gqa-head-mapping")
    kernel = dataclasses.replace(mutant, capabilities=dataclasses.replace(
        mutant.capabilities_on("cpu"), dtypes=(torch.bfloat16, torch.float32)), device_capabilities={})
    configs = [c for c in GRID if (c.head_dim, c.q_len, c.kv_len) == (64, 4, 128)]
    records = nightly.run_gate([kernel], "cpu", 1, nightly.cases(configs, []), progress=False)
    outcomes = {r.what: r.outcome for r in records}
    assert outcomes == {f"hd64-T4-S128-{layout}-{dtype}": "skipped" if dtype == "fp16" else
                        "failed" if layout == "gqa" else "passed"
                        for layout in ("mha", "gqa", "mqa") for dtype in ("bf16", "fp16", "fp32")}, outcomes
    assert all("dtype fp16 unsupported" in r.message for r in records if r.outcome == "skipped")


REFUSING = textwrap.dedent('''
    from fmha.contract import NotSupportedError
    from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, reference

    def fwd(q, k, v, **kwargs):  # declares every decode, refuses one at call time
        if q.shape[1] == 1 and k.shape[1] == 100:
            raise NotSupportedError("no split for 100 keys yet")
        return reference(q, k, v, **kwargs)

    fwd.capabilities = REFERENCE
''')


def test_a_not_supported_error_at_call_time_is_a_skip_in_the_gate_as_in_pytest(tmp_path, monkeypatch):
    """The README: a NotSupportedError for a call the capabilities accept is a skip with its
    reason, never a failure of the gate."""
    from fmha import registry
    from fmha.ci import nightly
    from fmha.properties.grid import GRID

    (tmp_path / "refusing_kernel.py").write_text(REFUSING)
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel = registry.resolve_kernel("refusing_kernel:fwd")
    configs = [c for c in GRID if c.head_dim == 64 and c.q_len == 1 and c.kv_len in (100, 128)]
    records = nightly.run_gate([kernel], "cpu", 1, nightly.cases(configs, []), progress=False)
    refused = [r for r in records if r.where["kv_len"] == 100]
    assert refused and all(r.outcome == "skipped" and "no split for 100 keys yet" in r.message for r in refused)
    assert all(r.outcome == "passed" for r in records if r.where["kv_len"] == 128)
    summary, failing = nightly.summarize(records, None, "# night")
    assert not failing and "no split for 100 keys yet" in summary, summary


def test_the_page_says_n_a_where_nothing_is_supported_and_colours_each_night_by_its_verdict():
    from fmha.ci import report_html

    gate = 0.999998
    labels = report_html.cell_labels({("hd64 T=1", "S=128"): 1.2e-6, ("hd64 T=1", "S=100"): None,
                                      ("hd64 T=4", "S=128"): 3e-6, ("hd64 T=4", "S=100"): report_html.RAISED}, gate)
    assert labels == {("hd64 T=1", "S=128"): "1.2e-06", ("hd64 T=1", "S=100"): "n/a",
                      ("hd64 T=4", "S=128"): "3.0e-06 ✗", ("hd64 T=4", "S=100"): "raised ✗"}
    night = dict(kernel="fmha", time="2026-12-05 03:00", configs=72, at_gate=72, below=0, raised=0, worst_gap=1.6e-6)
    assert not report_html.failed(night, gate)  # a passing night's square is green, though drawn near the line
    assert report_html.failed(dict(night, below=1, worst_gap=2.5e-6), gate)
    assert report_html.failed(dict(night, raised=1), gate)  # raised runs only: its returned runs at the gate


def _results(directory) -> list[RunRecord]:
    return [RunRecord.from_json(r) for r in json.loads((directory / "results.json").read_text())["records"]]


def _junit_ids(directory) -> list[tuple[str, str]]:
    return [(case.get("classname"), case.get("name")) for case in ET.parse(directory / "junit.xml").iter("testcase")]


def test_three_shards_merged_are_the_unsharded_night(tmp_path, capsys):
    """The gate as 3 shards (--shard I/3) and `merge`: together they ran every case of the
    unsharded night once; the merged report is the unsharded one config for config, in its order,
    with the same junit ids and one history line per kernel."""
    from fmha.ci import nightly
    from fmha.oracles import run_seed

    run_seed.use(run_seed.FIXED)  # the gate's values, as its command draws them
    common = ["--fmha-device", "cpu", "--head-dims", "64"]
    assert nightly.main([*common, "--out", str(tmp_path / "whole")]) == 0
    shard_dirs = [tmp_path / f"shard{i}" for i in (1, 2, 3)]
    for i, directory in enumerate(shard_dirs, 1):
        assert nightly.main([*common, "--shard", f"{i}/3", "--out", str(directory)]) == 0
    ran = [(r.kernel, r.run_id) for d in shard_dirs for r in _results(d)]
    whole = _results(tmp_path / "whole")
    assert sorted(ran) == sorted((r.kernel, r.run_id) for r in whole) and len(set(ran)) == len(ran)
    assert all(_results(d) for d in shard_dirs)  # each shard ran some

    assert nightly.main(["merge", *map(str, shard_dirs), "--out", str(tmp_path / "merged")]) == 0
    merged = _results(tmp_path / "merged")
    as_compared = lambda records: [(r.kernel, r.what, r.where, r.outcome, r.metrics) for r in records]  # noqa: E731
    assert as_compared(merged) == as_compared(whole)
    assert _junit_ids(tmp_path / "merged") == _junit_ids(tmp_path / "whole")
    assert len(set(_junit_ids(tmp_path / "merged"))) == len(_junit_ids(tmp_path / "merged"))
    history = (tmp_path / "merged" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["kernel"] for line in history] == ["fmha"]
    assert "3 shards merged" in (tmp_path / "merged" / "summary.md").read_text()


def test_a_merge_missing_a_shard_is_a_usage_error(tmp_path, capsys):
    from fmha.ci import nightly

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "results.json").write_text(json.dumps(dict(shard=[1, 3], records=[], header="", device="")))
    with pytest.raises(SystemExit) as exit_:
        nightly.main(["merge", str(tmp_path / "one"), "--out", str(tmp_path / "merged")])
    assert exit_.value.code == 2 and "expected shards 1/3 to 3/3 once each, got 1/3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        nightly.main(["--fmha-device", "cpu", "--shard", "4/3"])
    assert "expected I/N with 1 <= I <= N (shard I of N), got '4/3'" in capsys.readouterr().err


def test_the_property_suites_shards_collect_the_unsharded_suite_once(pytester):
    """pytest-split's --splits 3 --group I, as the nightly workflow's shards run the property
    suite: the three groups' tests are the unsharded collection, each once."""
    from fmha.properties import test_laws

    path = test_laws.__file__

    def collected(*options) -> list[str]:
        result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", *options, path)
        return [line for line in result.outlines if "::" in line]

    whole = collected()
    groups = [collected("--splits", "3", "--group", str(i)) for i in (1, 2, 3)]
    assert all(groups) and sorted(sum(groups, [])) == sorted(whole)


def test_the_gate_reads_the_ledger_a_known_failure_is_known_a_new_one_fails_a_fixed_one_is_said(tmp_path, monkeypatch):
    from fmha import registry
    from fmha.ci import nightly
    from fmha.properties.grid import GRID
    from fmha.regressions.ledger import KnownFailure

    (tmp_path / "blank_kernels.py").write_text(BLANK)
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel = registry.resolve_kernel("blank_kernels:nan")
    configs = [c for c in GRID if (c.head_dim, c.q_len, c.kv_len) == (64, 1, 128)]
    grid = nightly.cases(configs, [])  # its MHA, GQA and MQA cases in three dtypes, all NaN
    mha = KnownFailure(kernel.name, nightly.GATE_TEST, "NaN", "my#1", case="hd64-T1-S128-mha-*")
    records = nightly.run_gate([kernel], "cpu", 1, grid, progress=False, known=(mha,))
    assert {r.what: r.outcome for r in records} == {
        f"hd64-T1-S128-{layout}-{dtype}": "known" if layout == "mha" else "failed"
        for layout in ("mha", "gqa", "mqa") for dtype in ("bf16", "fp16", "fp32")}, [(r.what, r.outcome) for r in records]
    summary, failing = nightly.summarize(records, None, "# night")
    assert failing and "## Known failures (3 runs" in summary, summary  # the other layouts' failures are new
    every = KnownFailure(kernel.name, nightly.GATE_TEST, "NaN", "my#1", case="hd64-T1-S128-*")
    summary, failing = nightly.summarize(nightly.run_gate([kernel], "cpu", 1, grid, progress=False, known=(every,)),
                                         None, "# night")
    assert not failing, summary
    correct = registry.resolve_kernel("reference")
    records = nightly.run_gate([correct], "cpu", 1, grid, progress=False,
                               known=(KnownFailure("reference", nightly.GATE_TEST, "x", "my#2"),))
    assert {r.outcome for r in records} == {"fixed"} and "remove or narrow the record (kernel 'reference'" in \
        records[0].message
    assert nightly.summarize(records, None, "# night")[1]
