"""Every law of the contract (fmha.properties.catalog.LAWS) is its own test, named by its
record, for every selected kernel (and merge) that has what the law needs; the others skip,
saying why.

Samples come from hypothesis, inside each kernel's capabilities; a failure prints the shrunk
sample, a command that reruns it and the @example that pins it.
"""

import pytest

from fmha.properties.catalog import LAWS
from fmha.properties.law_record import Law
from fmha.properties.run_settings import law_settings, reproduce_command

pytestmark = pytest.mark.property


def _test_of(law: Law):
    def run(request, device, kernel=None, merge=None):
        law.run(device, kernel, merge, reproduce=reproduce_command(request.node),
                settings=law_settings(request.config))

    if law.operands == "kernel":
        def test(kernel, device, request):
            run(request, device, kernel=kernel)
    elif law.operands == "kernel+merge":
        def test(kernel, merge_kernel, device, request):
            run(request, device, kernel=kernel, merge=merge_kernel)
    else:
        def test(merge_kernel, device, request):
            run(request, device, merge=merge_kernel)
    test.__name__ = test.__qualname__ = law.test
    test.__doc__ = f"{law.name}: {law.summary}"
    return test


for _law in LAWS.values():
    globals()[_law.test] = _test_of(_law)
