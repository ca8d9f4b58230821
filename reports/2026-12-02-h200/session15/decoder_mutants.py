"""Session 15: tests/test_gluon_sparse.py's e2m1 decoder test fails on decoders with the bugs it is
for, in the byte-at-a-time decoder: fmha.gluon_sparse patched, its _fp4_values put in the test
module's place, every case run. `python decoder_mutants.py NAME` (one a process: the test kernel
compiles once a process). Session 14's runner does the work."""
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location(
    "session14", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../session14/decoder_mutants.py"))
session14 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(session14)

MUTANTS = {
    "high-nibble-first": ("gl.join((first * scale).to(gl.bfloat16), (second * scale).to(gl.bfloat16))",
                          "gl.join((second * scale).to(gl.bfloat16), (first * scale).to(gl.bfloat16))"),
    "halves-scales-swapped": ("scale = gl.where((pairs < 16)[None, :][None, :, :]",
                              "scale = gl.where((pairs >= 16)[None, :][None, :, :]"),
    "signs-dropped": ("((both & 0x80008) << 12)", "((both & 0) << 12)"),
    "high-nibble-misplaced": ("both = byte * 4097", "both = byte * 65537"),
}
session14.caught(MUTANTS, sys.argv[1])
