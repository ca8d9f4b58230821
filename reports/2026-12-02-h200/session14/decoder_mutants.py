"""Session 14: tests/test_gluon_sparse.py's e2m1 decoder test fails on decoders with the bugs it is
for: fmha.gluon_sparse patched, its _fp4_values put in the test module's place, every case run.
`python decoder_mutants.py NAME` (one a process: the test kernel compiles once a process)."""
import inspect
import sys

from fmha import gluon_sparse
from fmha.regressions.mutation import _import_patched, patch_source
from tests import test_gluon_sparse as tests

MUTANTS = {
    "high-nibble-first": ("value = gl.join((_e2m1(byte) * scale).to(gl.bfloat16), (_e2m1(byte >> 4) * scale)",
                          "value = gl.join((_e2m1(byte >> 4) * scale).to(gl.bfloat16), (_e2m1(byte) * scale)"),
    "halves-scales-swapped": ("scale = gl.where((pairs < 16)[None, :][None, :, :]",
                              "scale = gl.where((pairs >= 16)[None, :][None, :, :]"),
}


def caught(mutants: dict, name: str) -> None:
    """Run the e2m1 decoder test's cases on fmha.gluon_sparse with mutants[name] patched in; print
    how many cases caught it."""
    module = _import_patched("_decoder", name, patch_source(inspect.getsource(gluon_sparse), (mutants[name],), name,
                                                            "fmha/gluon_sparse.py"))
    gluon_sparse._fp4_values = module._fp4_values
    failures = []
    for low_high in tests.FP4_SCALE_CODES:
        try:
            tests.test_e2m1_decoder_matches_the_oracle(low_high, "cuda")
        except AssertionError as e:
            if "decode differently" not in str(e):  # not the test's own verdict
                raise
            failures.append(str(e).splitlines()[0])
    print(f"{name}: caught by {len(failures)} of {len(tests.FP4_SCALE_CODES)} cases; first: {failures[:1]}",
          flush=True)


if __name__ == "__main__":
    caught(MUTANTS, sys.argv[1])
