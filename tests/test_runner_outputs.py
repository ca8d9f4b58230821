"""What a runner gets: deterministic shards across hosts (pytest-split), JUnit XML, and the
tests that wait out a timeout first."""

import re
import textwrap
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]

SESSION = textwrap.dedent('''
    import pytest

    @pytest.mark.parametrize("n", range(10))
    def test_n(n, device):
        assert device in ("cpu", "cuda")
''')


def _collected(result) -> list[str]:
    return re.findall(r"^(test_session\.py::\S+)$", result.stdout.str(), re.M)


def test_two_shards_are_disjoint_cover_everything_and_repeat(pytester):
    pytest.importorskip("pytest_split", reason="pytest-split is not installed (pip install pytest-split): "
                                               "sharding across hosts needs it")
    pytester.makepyfile(test_session=SESSION)
    everything = _collected(pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider"))
    shards = [_collected(pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                                            "--splits", "2", "--group", str(g))) for g in (1, 2)]
    again = _collected(pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--splits", "2", "--group", "1"))
    assert len(everything) == 10
    assert sorted(shards[0] + shards[1]) == sorted(everything) and not set(shards[0]) & set(shards[1])
    assert again == shards[0]


@pytest.mark.starts_first  # a nested two-worker session
def test_junit_xml_lists_every_test(pytester, device):
    pytester.makepyfile(test_session=SESSION)
    report = pytester.path / "junit.xml"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--fmha-device={device}", "-n", "2", "--fmha-seed=4242",
                                  f"--junitxml={report}").assert_outcomes(passed=10)
    root = ET.parse(report).getroot()
    seeds = [p.get("value") for p in root.iter("property") if p.get("name") == "fmha_seed"]
    assert seeds == ["4242"], seeds  # the run's values drawn again from the report alone
    cases = root.iter("testcase")
    names = sorted(c.get("name") for c in cases)
    assert names == sorted(f"test_n[{n}]" for n in range(10))
    if device == "cuda":  # each test says which GPU its worker was pinned to
        gpus = [p.get("value") for p in ET.parse(report).getroot().iter("property") if p.get("name") == "gpu"]
        assert len(gpus) == 10 and all(g.isdigit() for g in gpus)


@pytest.mark.cpu_tier  # scheduling is the same whatever the device
@pytest.mark.parametrize("dist", ["load", "worksteal"])
def test_under_xdist_each_worker_starts_with_a_different_timeout_bound_test(pytester, dist):
    log = pytester.path / "ran.txt"
    pytester.makepyfile(test_session=textwrap.dedent(f'''
        import os
        import pytest

        def _ran(name):
            with open({str(log)!r}, "a") as f:
                f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + name + "\\n")

        @pytest.mark.parametrize("n", range(10))
        def test_rest(n): _ran(f"rest{{n}}")

        @pytest.mark.starts_first
        def test_first_a(): _ran("first_a")

        @pytest.mark.starts_first
        @pytest.mark.skip(reason="takes no time: must not take a worker's head")
        @pytest.mark.parametrize("n", range(2))
        def test_first_skipped(n): _ran("first_skipped")

        @pytest.mark.starts_first
        def test_first_b(): _ran("first_b")
    '''))
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fmha-device=cpu", "-n", "2",
                                  f"--dist={dist}").assert_outcomes(passed=12, skipped=2)
    by_worker = {}
    for line in log.read_text().splitlines():
        worker, name = line.split()
        by_worker.setdefault(worker, []).append(name)
    assert sorted(names[0] for names in by_worker.values()) == ["first_a", "first_b"], by_worker


def test_tests_that_wait_out_a_timeout_are_collected_first_the_rest_in_order(pytester):
    pytester.makepyfile(test_session=textwrap.dedent('''
        import pytest

        def test_a(): pass

        @pytest.mark.starts_first
        def test_b(): pass

        def test_c(): pass
    '''))
    order = _collected(pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider"))
    assert order == ["test_session.py::test_b", "test_session.py::test_a", "test_session.py::test_c"], order


@pytest.mark.cpu_tier
def test_under_worksteal_the_laws_of_fmhas_kernels_head_every_workers_batch():
    """Collected last, the laws of fmha's own kernels (a compile per draw on a cold GPU) were a
    cold run's tail on one worker; dealt in turn, each worker's batch starts with its share."""
    from types import SimpleNamespace

    from fmha.ci.plugin import starts_first_order
    from fmha.registry import KERNELS

    class item:  # a collected test, as the ordering reads one
        def __init__(self, name, marker=None, kernel=None):
            self.name, self.marker = name, marker
            self.callspec = SimpleNamespace(params={"kernel": KERNELS[kernel]} if kernel else {})

        def get_closest_marker(self, name):
            return name == self.marker or None

    items = ([item(f"rest{n}") for n in range(30)] + [item(f"sdpa-law{n}", "property", "sdpa-math") for n in range(2)]
             + [item(f"fmha-law{n}", "property", "fmha") for n in range(8)])
    config = SimpleNamespace(workerinput={"workercount": 4, "fmha_dist": "worksteal"})
    order = [i.name for i in starts_first_order(items, config)]
    batches = [order[w * 10:(w + 1) * 10] for w in range(4)]
    assert sorted(order) == sorted(i.name for i in items)
    assert [b[:2] for b in batches] == [[f"fmha-law{w}", f"fmha-law{w + 4}"] for w in range(4)], batches
