"""Deprecated name of `fmha.oracles.dense_reference` (the float64 references of dense attention
and the merge), kept so that imports of `fmha.oracles.reference` go on working: it is that module,
not a copy. Import `fmha.oracles.dense_reference`; the oracle over any call, paged and sparse
included, is `fmha.oracles.oracle`."""

import sys
import warnings

from fmha.oracles import dense_reference

warnings.warn("fmha.oracles.reference is now fmha.oracles.dense_reference (the oracle over any call: "
              "fmha.oracles.oracle)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = dense_reference
