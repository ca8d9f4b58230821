"""A nightly spread over N runners: `--shard I/N` takes the I-th of N deterministic parts of a list
in a fixed order (the gate's grid cases, the sanitizer's named cases), every N-th item from the
I-th. The same N gives the same parts on every run; together they are the list, once each."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    index: int  # 1..count
    count: int

    def take(self, items: Sequence[T]) -> list[T]:
        return list(items[self.index - 1::self.count])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(1, 1)


def parse(text: str) -> Shard:
    """"I/N" (1 <= I <= N) as a Shard; anything else an argparse error naming what came in."""
    index, slash, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        shard = None
    if not slash or shard is None or not 1 <= shard.index <= shard.count:
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N (shard I of N), got {text!r}")
    return shard


def add_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--shard", type=parse, default=WHOLE, metavar="I/N",
                        help=f"run the I-th of N deterministic parts of {what} (one runner of N); "
                             "`python -m fmha.ci.nightly merge` joins the parts' reports")
