"""The GPU's SM clock and board power while a contender is timed (`python -m fmha.bench --clocks`).

Two kernels can take the same cycles and still differ in time: one that draws the board to its
power cap runs at a lower clock. nvidia-smi samples the GPU every 50 ms while the timing runs;
a cell says the median SM clock and power over those samples and the share of them with a power
or thermal limit holding the clock down.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from dataclasses import dataclass

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
# clocks_event_reasons bits that hold the clock below what the load asks for: SW power cap, HW
# slowdown, SW thermal slowdown, HW thermal slowdown, HW power brake (nvidia-smi -q's names).
LIMITS = 0x04 | 0x08 | 0x20 | 0x40 | 0x80
STARTUP_S = 5.0  # nvidia-smi's own start: its first sample, taken before the load, is dropped


@dataclass(frozen=True)
class Reading:
    mhz: float
    watts: float | None  # None where the board does not report power
    limited: float  # the share of samples with a power or thermal limit active
    samples: int

    def __str__(self) -> str:
        power = f", {self.watts:.0f} W" if self.watts is not None else ""
        return f"{self.mhz:.0f} MHz{power}, limited {self.limited:.0%}"


def parse(lines: list[str]) -> Reading | None:
    """nvidia-smi's `--query-gpu=QUERY --format=csv,noheader,nounits` lines (one a sample) as one
    Reading, or None where no line is a sample."""
    mhz, watts, limited = [], [], 0
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            clock, reasons = float(fields[0]), int(fields[2], 16)
        except ValueError:  # "[N/A]" or a message
            continue
        mhz.append(clock)
        limited += bool(reasons & LIMITS)
        try:
            watts.append(float(fields[1]))
        except ValueError:
            pass
    if not mhz:
        return None
    return Reading(statistics.median(mhz), statistics.median(watts) if watts else None, limited / len(mhz), len(mhz))


def device_id(index: int) -> str:
    """nvidia-smi's -i for torch's CUDA device `index`: its UUID, which CUDA_VISIBLE_DEVICES does not
    renumber; the index where torch does not say it."""
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if not uuid:
        return str(index)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def available() -> str | None:
    """Why --clocks cannot sample, or None."""
    return None if shutil.which("nvidia-smi") else "nvidia-smi is not on PATH"


class Sampler:
    """`with Sampler(device) as s: ...` samples GPU `device` (nvidia-smi's -i) while the block runs;
    `s.reading` is then its Reading, or None (no sample came, or nvidia-smi failed)."""

    def __init__(self, device: str, interval_ms: int = 50):
        self.command = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-i", device,
                        "-lms", str(interval_ms)]
        self.lines: list[str] = []
        self.reading: Reading | None = None
        self._first = threading.Event()

    def _read(self) -> None:
        for line in self._process.stdout:
            self.lines.append(line)
            self._first.set()
        self._first.set()  # nvidia-smi ended: nobody waits for a first sample that will not come

    def __enter__(self) -> Sampler:
        self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._first.wait(STARTUP_S)
        self._start = len(self.lines)
        return self

    def __exit__(self, *exc) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._reader.join(timeout=5)
        self.reading = parse(self.lines[self._start:])
