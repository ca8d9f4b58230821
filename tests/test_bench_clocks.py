"""`python -m fmha.bench --clocks`: the SM clock and power nvidia-smi reports while a contender is
timed. The sampling runs here against a stand-in nvidia-smi; the GPU's own numbers are in
BENCHMARKS.md."""

import os
import stat
import sys

import pytest

from fmha.bench import clocks
from fmha.bench import dense as bench

IDLE = "345, 80.10, 0x0000000000000001"  # GPU idle: not a limit
CAPPED = "1860, 691.44, 0x0000000000000004"  # SW power cap


def test_a_reading_is_the_median_of_the_samples_and_the_share_held_by_a_limit():
    reading = clocks.parse([CAPPED, "1980, 651.70, 0x0000000000000000", "1785, 687.54, 0x0000000000000004\n"])
    assert (reading.mhz, reading.watts, reading.samples) == (1860, 687.54, 3)
    assert reading.limited == pytest.approx(2 / 3)
    assert str(reading) == "1860 MHz, 688 W, limited 67%"
    assert clocks.parse([IDLE]).limited == 0, "an idle GPU's clock is not held down by a limit"


def test_a_board_without_power_readings_and_lines_that_are_not_samples():
    reading = clocks.parse(["No devices were found", "1755, [N/A], 0x0000000000000000", ""])
    assert (reading.mhz, reading.watts, reading.limited) == (1755, None, 0)
    assert str(reading) == "1755 MHz, limited 0%"
    assert clocks.parse(["Failed to initialize NVML: Driver/library version mismatch"]) is None


def test_nvidia_smi_is_told_the_gpu_by_its_uuid_which_cuda_visible_devices_does_not_renumber(monkeypatch):
    from types import SimpleNamespace

    props = {0: SimpleNamespace(uuid="58af3e5b-7e0c-1c2d-9f3a-0123456789ab"), 3: SimpleNamespace()}
    monkeypatch.setattr(bench.torch.cuda, "get_device_properties", props.__getitem__)
    assert clocks.device_id(0) == "GPU-58af3e5b-7e0c-1c2d-9f3a-0123456789ab"
    assert clocks.device_id(3) == "3"


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that records its arguments, prints one idle sample at once and then
    capped ones every 10 ms until it is stopped."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\n"
                      "import sys, time\n"
                      f"open({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                      f"print({IDLE!r}, flush=True)\n"
                      "time.sleep(0.2)\n"
                      "while True:\n"
                      f"    print({CAPPED!r}, flush=True)\n"
                      "    time.sleep(0.01)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_the_sampler_drops_the_sample_taken_before_the_load_and_stops_nvidia_smi(fake_smi):
    import time

    with clocks.Sampler("GPU-1234") as sampler:
        time.sleep(0.4)
    assert sampler._process.poll() is not None, "nvidia-smi still runs after the timed block"
    reading = sampler.reading
    assert reading is not None and reading.samples >= 3
    assert (reading.mhz, reading.limited) == (1860, 1.0), "the idle sample nvidia-smi took at its start was counted"
    argv = (fake_smi / "argv").read_text().split()
    assert argv[argv.index("-i") + 1] == "GPU-1234" and f"--query-gpu={clocks.QUERY}" in argv


def test_a_sampler_whose_nvidia_smi_fails_reads_nothing(tmp_path, monkeypatch):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with clocks.Sampler("7") as sampler:
        pass
    assert sampler.reading is None


def test_clocks_without_nvidia_smi_is_a_usage_error_that_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--sparse", "--clocks"])
    assert exit_.value.code == 2
    assert "--clocks: nvidia-smi is not on PATH" in capsys.readouterr().err


def test_the_bench_samples_each_contender_while_it_is_timed_and_tables_the_reading(fake_smi, monkeypatch):
    """The wiring of `--clocks`: one clock cell per contender, from the samples taken while it was
    timed (a contender that raises gets "—")."""
    import time

    from fmha.tables import Table

    def timed(run):
        time.sleep(0.4)
        return run()

    def broken(problem):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(bench, "time_us", timed)
    monkeypatch.setattr(clocks, "device_id", lambda index: "GPU-1234")
    monkeypatch.setattr(bench.torch.cuda, "current_device", lambda: 0)
    table, clock_table = Table(["shape", "floor µs", "fmha", "other", "fmha / floor"]), Table(["shape", "fmha", "other"])
    bench._rows({"a shape": None}, {"fmha": lambda problem: lambda: 12.5, "other": broken}, lambda problem: (),
                lambda problem: 10.0, table, clock_table)
    assert table.rows == [["a shape", "10.0", "12.5", "— (RuntimeError: no kernel for this shape)", "1.25x"]]
    assert clock_table.rows == [["a shape", "1860 MHz, 691 W, limited 100%", "—"]]
