"""The judge's guard around every call of a kernel or a merge under test (every `KernelEntry`
and `MergeEntry` call, once this module is imported: fmha.contract.kernel.guard_calls).

Kernels come from code generators, which learn to pass a check without computing the answer.
Around each call the guard makes sure that

- **nothing is there to steal**: every answer the judge makes (the oracle's tensors, the plain
  references) is registered (`answer`), and before a call each one still alive (or in garbage
  not yet collected) is emptied to no elements. The judge computes its answers after a
  call and needs none during one; a test that did would fail on the empty tensor;
- **the judge is what it was**: the bindings of the judge's modules, its functions' code, the
  contents of its tables and the torch functions it calls are recorded before the first call;
  after each call every one is compared with the record, restored where it changed, and the
  call fails naming what changed;
- **only plain tensors come back**: an output that is not exactly `torch.Tensor` (a subclass
  whose storage holds something else), not strided, a functional tensor, one with the negative
  or conjugate bit (memory holding -o or conj(o) where torch shows o), or not on q's device
  fails; what is judged is read from the output's storage (fmha.oracles.kernel_call.from_memory);
- **torch is as the call found it**: a torch function or dispatch mode the call pushed and left
  (every later torch call of the judge's would go through it) fails the call and is popped; the
  dispatch tables of the operators the judge computes with are compared at the end of each test
  that called a kernel (`end_of_test`): a kernel registered over one of them (torch.library)
  fails it;
- **outputs stay what was judged**: the bytes of each tensor a call returned are kept while it
  is alive and compared after every later call and at the end of the test (`end_of_test`).

It runs in the kernel's process. Its own checks run in the frame of the call they guard, from
locals bound when the frame started, so rebinding, recoding or patching anything a kernel can
reach from Python (the guard included) is caught after that call and undone. A kernel that
writes the process's memory directly (ctypes) is out of its reach; BENCHMARKS.md ("The judge's
guard") has what it costs and why it runs in-process.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import gc
import inspect
import itertools
import operator
import os
import re
import sys
import types
import weakref

import torch

from fmha.contract import kernel as _kernel

# The judge: what it computes with, what it draws, what it compares against. Recorded at the first
# guarded call (by then a test session has imported them all); one imported later is recorded
# when first seen.
JUDGE_MODULES = (
    "fmha.contract.kernel", "fmha.contract.validation", "fmha.contract.paged_validation", "fmha.contract.slots",
    "fmha.contract.cache_layouts", "fmha.contract.capabilities", "fmha.contract.problem",
    "fmha.oracles.check", "fmha.oracles.diagnose", "fmha.oracles.distributions", "fmha.oracles.guard",
    "fmha.oracles.hazards", "fmha.oracles.inputs", "fmha.oracles.kernel_call", "fmha.oracles.metrics",
    "fmha.oracles.oracle", "fmha.oracles.paged_inputs", "fmha.oracles.production", "fmha.oracles.replay_child",
    "fmha.oracles.quantization", "fmha.oracles.dense_reference",
    "fmha.oracles.reference_kernel", "fmha.oracles.sample", "fmha.oracles.verdict", "fmha.oracles.run_seed",
    "fmha.properties.law_record", "fmha.properties.dense_laws", "fmha.properties.paged_laws",
    "fmha.properties.covering", "fmha.properties.scale", "fmha.properties.strategies",
    "fmha.properties.paged_strategies",
    "fmha.regressions.trap", "fmha.regressions.symptoms",
)
# torch namespaces whose functions the judge calls as torch.<name>, torch.linalg.<name>, ...
TORCH_OWNERS = {"torch": torch, "torch.linalg": torch.linalg, "torch.nn.functional": torch.nn.functional,
                "torch.special": torch.special}

_MISSING = object()
_ANSWERS: weakref.WeakSet = weakref.WeakSet()


def answer(*tensors):
    """Register the judge's answers (float64 outputs of the oracle and the plain references):
    emptied before the next kernel call if still alive then. Returns its arguments."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            _ANSWERS.add(t)
            if t._base is not None:  # a view's base holds its elements: emptied with it
                _ANSWERS.add(t._base)
    return tensors[0] if len(tensors) == 1 else tensors


def release_answers() -> None:
    """Empty every answer of the judge's still alive (what the guard does before each call)."""
    for t in list(_ANSWERS):  # those in garbage not yet collected (a failed test's frames) too
        t.set_()  # no elements: nothing of an answer's shape is left to find
    _ANSWERS.clear()


# -- the record of the judge ------------------------------------------------------------------
# Flat probes, each an identity test: (kind, owner, name, value) with kind
#   "item": owner (a module's or a table's dict) maps name to value;
#   "attr": getattr(owner, name) is value (a record's field);
#   "class": getattr(owner, name) is value[0], an attribute of the class owner, its own if value[1];
#   "keys": the dict owner has exactly the keys `value`;
#   "code": the function owner has the code, defaults and kwdefaults `value`.

# A judge module names the state it changes as it runs (`__judge_state__`): not a part of what
# judges, so not recorded, wherever it is imported.
__judge_state__ = ("_KEPT", "_LAST", "_CALLS", "_CALLS_CHECKED", "_PROBES", "_READS", "_ANSWERS", "_OPERATORS")
_PROBES: dict[str, list] = {}  # module name -> its probes


def _state() -> set[int]:
    return {id(getattr(module, name)) for module in map(sys.modules.get, JUDGE_MODULES) if module is not None
            for name in getattr(module, "__judge_state__", ())}


def _record_value(value, where: str, probes: list, seen: set) -> None:
    """Probes for what a bound value holds: a function's code, a table's entries, a record's fields."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, types.FunctionType):  # named where it is defined, however it was imported
        probes.append(("code", value, f"{value.__module__}.{value.__qualname__}",
                       (value.__code__, value.__defaults__, value.__kwdefaults__)))
    elif isinstance(value, types.MappingProxyType):  # a read-only table: what it reads through
        _record_value(gc.get_referents(value)[0], where, probes, seen)
    elif isinstance(value, dict):
        probes.append(("keys", value, where, tuple(value)))
        for key, item in value.items():
            probes.append(("item", value, key, item))
            _record_fields(item, f"{where}[{key!r}]", probes, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _record_fields(item, where, probes, seen)
    else:
        _record_fields(value, where, probes, seen)


def _record_fields(record, where: str, probes: list, seen: set) -> None:
    if dataclasses.is_dataclass(record) and not isinstance(record, type) and id(record) not in seen:
        seen.add(id(record))
        probes += [("attr", record, f.name, getattr(record, f.name)) for f in dataclasses.fields(record)]


def _record_module(module) -> list:
    probes, seen, state = [], set(), _state()
    namespace = vars(module)
    for name, value in list(namespace.items()):
        if name.startswith("__") or isinstance(value, types.ModuleType) or id(value) in state:
            continue
        probes.append(("item", namespace, name, value))
        _record_value(value, f"{module.__name__}.{name}", probes, seen)
        if isinstance(value, type) and value.__module__ == module.__name__:  # its methods
            for attr, member in list(vars(value).items()):
                if isinstance(member, (types.FunctionType, property, staticmethod, classmethod)):
                    probes.append(("class", value, attr, (getattr(value, attr), True)))
                    _record_value(member, f"{module.__name__}.{name}.{attr}", probes, seen)
    return probes + _torch_probes(module)


def _torch_probes(module) -> list:
    """The torch functions and tensor methods the module's source calls."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return []
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        owner_name = ".".join([base.id, *reversed(chain[1:])]) if isinstance(base, ast.Name) else None
        owner = TORCH_OWNERS.get(owner_name)
        if owner is None and not node.attr.startswith("__") and hasattr(torch.Tensor, node.attr):
            owner = torch.Tensor
        if owner is not None and hasattr(owner, node.attr):
            probe = (getattr(owner, node.attr), isinstance(owner, type) and node.attr in vars(owner))
            found[(id(owner), node.attr)] = ("class" if isinstance(owner, type) else "item", owner if isinstance(
                owner, type) else vars(owner), node.attr, probe if isinstance(owner, type) else probe[0])
    return list(found.values())


def _record_new_modules() -> None:
    for name in JUDGE_MODULES:
        module = sys.modules.get(name)
        if module is not None and name not in _PROBES:
            _PROBES[name] = _record_module(module)


def _name_of(owner) -> str:
    if isinstance(owner, dict) and "__name__" in owner:
        return owner["__name__"]
    return getattr(owner, "__qualname__", None) or type(owner).__qualname__


def _broken(kind, owner, name, value) -> str | None:
    """What differs from the probe (then restored), or None."""
    if kind == "item":
        if owner.get(name, _MISSING) is value:
            return None
        owner[name] = value
        return f"{_name_of(owner)}.{name} was rebound" if "__name__" in owner else f"an entry of {name!r} was changed"
    if kind == "attr":  # a record's field
        if getattr(owner, name, _MISSING) is value:
            return None
        object.__setattr__(owner, name, value)
        return f"{_name_of(owner)}.{name} was changed"
    if kind == "class":  # a class's attribute, its own or inherited (value: (attribute, own))
        if getattr(owner, name, _MISSING) is value[0]:
            return None
        setattr(owner, name, value[0]) if value[1] else delattr(owner, name)
        return f"{_name_of(owner)}.{name} was rebound"
    if kind == "keys":
        if tuple(owner) == value:
            return None
        for key in [k for k in owner if k not in value]:
            del owner[key]
        return f"{name} had entries added or removed"
    code, defaults, kwdefaults = value
    if owner.__code__ is code and owner.__defaults__ is defaults and owner.__kwdefaults__ is kwdefaults:
        return None
    owner.__code__, owner.__defaults__, owner.__kwdefaults__ = code, defaults, kwdefaults
    return f"the code of {name} was replaced"


def _reads(probes: list) -> tuple:
    """A module's probes as (getter, owners, names, expected) columns, so that one pass of C
    loops (map, operator.is_) tells whether any differs: thousands of probes in well under a
    millisecond, where a Python loop over them took several."""
    columns = []
    for getter, kind, read in ((dict.get, "item", lambda p: (p[1], p[2], p[3])),
                               (getattr, "attr", lambda p: (p[1], p[2], p[3])),
                               (getattr, "class", lambda p: (p[1], p[2], p[3][0])),
                               (getattr, "code", lambda p: (p[1], "__code__", p[3][0])),
                               (getattr, "code", lambda p: (p[1], "__defaults__", p[3][1])),
                               (getattr, "code", lambda p: (p[1], "__kwdefaults__", p[3][2]))):
            chosen = [read(p) for p in probes if p[0] == kind]
            owners, names, expected = (tuple(c) for c in zip(*chosen)) if chosen else ((), (), ())
            columns.append((getter, owners, names, expected))
    keys = tuple((p[1], p[3]) for p in probes if p[0] == "keys")
    return tuple(columns), keys


def _unchanged(reads) -> bool:
    columns, keys = reads
    for getter, owners, names, expected in columns:
        if owners and not all(map(operator.is_, map(getter, owners, names, itertools.repeat(_MISSING)), expected)):
            return False
    return all(tuple(owner) == value for owner, value in keys)


_READS: dict[tuple, tuple] = {}  # the recorded modules' names -> all their probes' columns (_reads)


def judge_changes() -> list[str]:
    """Everything about the judge that differs from its record, each restored."""
    _record_new_modules()
    recorded = tuple(_PROBES)
    if recorded not in _READS:
        _READS.clear()
        _READS[recorded] = _reads([probe for probes in _PROBES.values() for probe in probes])
    if _unchanged(_READS[recorded]):
        return []
    return [what for probes in _PROBES.values() for probe in probes if (what := _broken(*probe))]


# -- outputs ------------------------------------------------------------------------------------

_KEPT: list = []  # (weak reference to a returned tensor, its bytes, which call returned it)
_LAST: list = []  # the last call's outputs, held to the end of the test (where a test's own references are gone)
_CALLS = [0]
_CALLS_CHECKED = [0]  # _CALLS when the registrations were last checked


def _bytes_of(t: torch.Tensor, copy: bool = True) -> torch.Tensor:
    """t's bytes (a copy to keep, or a view where t is contiguous, to compare)."""
    if not t.numel():
        return t.new_zeros(0, dtype=torch.uint8)
    flat = t.detach().reshape(-1)
    if flat.stride(0) != 1:  # one element a row (head dim 1): reshape keeps the row stride
        return flat.contiguous().view(torch.uint8)
    return (flat.clone() if copy else flat).view(torch.uint8)


def _keep(result, call: str) -> None:
    tensors = result if isinstance(result, (tuple, list)) else (result,)
    _LAST[:] = [t for t in tensors if type(t) is torch.Tensor]
    for t in _LAST:
        _KEPT.append((weakref.ref(t), _bytes_of(t), call))


def _outputs_changed(during: str) -> list[str]:
    changed, alive = [], []
    for ref, saved, call in _KEPT:
        t = ref()
        if t is None:
            continue
        alive.append((ref, saved, call))
        now = _bytes_of(t, copy=False)
        if now.shape != saved.shape or not torch.equal(now, saved):
            changed.append(f"the kernel changed an output it had already returned ({call}'s) {during}")
            alive[-1] = (ref, _bytes_of(t), call)  # reported once
    _KEPT[:] = alive
    return changed


def _forget_handed_in(args, kwargs) -> None:
    """Outputs handed to this call again (an `out=` buffer reused): the caller asked for them to change."""
    given = {t.untyped_storage().data_ptr() for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)}
    if given:
        _KEPT[:] = [(ref, saved, call) for ref, saved, call in _KEPT
                    if (t := ref()) is not None and t.untyped_storage().data_ptr() not in given]


def end_of_test() -> list[str]:
    """At the end of a test: the outputs its calls returned that changed since, and (after a test
    that called a kernel) the operators the judge computes with that have another kernel
    registered; forgets the outputs."""
    called, _CALLS_CHECKED[0] = _CALLS[0] != _CALLS_CHECKED[0], _CALLS[0]
    changed = _outputs_changed("after its last call") + (registrations_changed() if called else []) + _modes_left((0, 0))
    _KEPT.clear()
    _LAST.clear()
    return changed


# -- torch's state --------------------------------------------------------------------------------

# The aten operators one verdict computes with, recorded by a dispatch mode around the oracle and
# the metrics (tests/test_production_context.py holds this list and the recording equal; recording
# it here would cost each process the second torch's dispatch modes take to import) -> their
# dispatch table when last found with no kernel from outside torch.
_OPERATORS: dict[str, str] = dict.fromkeys(("aten::" + name for name in (
    "_local_scalar_dense", "_to_copy", "_unsafe_view", "abs", "add.Tensor", "amax", "any", "any.dim", "arange",
    "argmax", "bitwise_and.Tensor", "bitwise_and_.Tensor", "bitwise_not", "bitwise_or.Tensor", "bmm", "cat",
    "clamp", "clone", "div.Tensor", "eq.Scalar", "eq.Tensor", "exp", "expand", "frexp.Tensor", "full_like",
    "gt.Scalar", "index.Tensor", "isinf", "isnan", "isneginf", "ldexp.Tensor", "le.Tensor",
    "linalg_vector_norm", "logsumexp", "lt.Scalar", "lt.Tensor", "masked_fill.Scalar", "masked_select", "max",
    "maximum", "mul.Tensor", "ne.Scalar", "ne.Tensor", "neg", "nonzero", "ones", "ones_like", "permute",
    "pow.Tensor_Scalar", "scalar_tensor", "select.int", "slice.Tensor", "sqrt", "stack", "sub.Tensor", "sum",
    "sum.dim_IntList", "transpose.int", "unsqueeze", "view", "where.self", "zeros_like",
)), "")


def registrations_changed() -> list[str]:
    """The operators the judge computes with that have a kernel registered from outside torch
    (through torch.library, or an extension's TORCH_LIBRARY_IMPL) for any dispatch key."""
    changed = []
    for op, clean in _OPERATORS.items():
        table = torch._C._dispatch_dump_table(op)
        if table == clean:
            continue
        foreign = [line for line in table.splitlines() if (where := _REGISTERED_AT.search(line))
                   and not where.group(1).startswith(_TORCHS_OWN)
                   and not any(part in where.group(1) for part in ("/aten/src/", "/torch/csrc/"))]
        if foreign:
            changed.append(f"the operator {op}, which the judge computes with, has a kernel registered from outside "
                           f"torch ({'; '.join(foreign)[:200]}): the judge's arithmetic would run it")
        else:
            _OPERATORS[op] = table
    return changed


_REGISTERED_AT = re.compile(r"registered at (\S+)")
_TORCHS_OWN = os.path.dirname(torch.__file__)


@contextlib.contextmanager
def plain_torch():
    """A context in which torch calls reach torch's kernels: no torch function or dispatch mode,
    no subclass's __torch_function__ or __torch_dispatch__ (what the judge computes under)."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        yield


def _torch_modes(_functions=torch._C._len_torch_function_stack, _dispatches=torch._C._len_torch_dispatch_stack):
    return _functions(), _dispatches()


def _modes_left(before, _pop_function=torch._C._pop_torch_function_stack,
                _pop_dispatch=torch._C._pop_torch_dispatch_stack) -> list[str]:
    """The torch modes the call pushed and did not pop: popped, and named."""
    functions, dispatches = _torch_modes()
    left = []
    for _ in range(functions - before[0]):
        left.append(f"a torch function mode ({type(_pop_function()).__qualname__})")
    for _ in range(dispatches - before[1]):
        left.append(f"a torch dispatch mode ({type(_pop_dispatch(None)).__qualname__})")
    problems = [f"the call left {what} active: every torch call after it (the judge's too) would go through it; "
                "scope a mode to the call (`with mode:`)" for what in left]
    if functions < before[0] or dispatches < before[1]:
        problems.append("the call popped a torch mode its caller had pushed")
    return problems


def _not_plain(result, args) -> list[str]:
    tensors = result if isinstance(result, (tuple, list)) else (result,)
    if len(tensors) != 2:  # the contract's (o, lse): what came back, before what is in it
        return [f"expected (o, lse) with lse a tensor or None, got a {type(result).__name__}"
                + (f" of {len(tensors)}: ({', '.join(type(t).__name__ for t in tensors)})" if tensors is result else "")]
    q = args[0] if args and isinstance(args[0], torch.Tensor) else None
    found = []
    for position, t in enumerate(tensors):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            found.append(f"output {position} is a {type(t).__qualname__}, not a tensor (the contract's (o, lse): "
                         "lse a tensor or None)")
        elif type(t) is not torch.Tensor:
            found.append(f"output {position} is a {type(t).__module__}.{type(t).__qualname__}, not a plain "
                         f"torch.Tensor (a subclass or wrapper: what its storage holds is not what torch sees)")
        elif t.layout is not torch.strided or torch._is_functional_tensor(t):
            found.append(f"output {position} is not a plain strided tensor ({t.layout}"
                         f"{', functional' if t.layout is torch.strided else ''}): what torch shows is not its memory")
        elif t.is_neg() or t.is_conj():
            found.append(f"output {position} has the {'negative' if t.is_neg() else 'conjugate'} bit set: its memory "
                         f"holds {'-o' if t.is_neg() else 'conj(o)'} where torch shows o; return the values themselves "
                         "(.resolve_neg(), .resolve_conj())")
        elif q is not None and t.device != q.device:
            found.append(f"output {position} is on {t.device}, not on q's device {q.device}")
    return found


# -- the call ---------------------------------------------------------------------------------

def guarded_call(entry, args, kwargs, _checked=(), _globals=None, _builtins=(), _builtin_dict=None, _depth=None,
                 _calls=None, _self=()):
    """Run `entry`'s call with the guard around it. Only the outermost call of a nesting (a
    kernel under test that calls another entry) is guarded. The defaults are bound below, at
    import: they become this frame's locals when it starts, beyond the kernel's reach."""
    __tracebackhide__ = True  # a failure shows the kernel's frames and the judge's message, not the guard's locals
    if _depth[0]:
        return entry.fn(*args, **kwargs)
    _calls[0] += 1
    number = _calls[0]
    _globals["_record_new_modules"]()  # the judge as it is before the kernel first runs
    _globals["release_answers"]()
    _globals["_forget_handed_in"](args, kwargs)
    modes = _globals["_torch_modes"]()
    _depth[0] = 1
    error = result = None
    try:
        result = entry.fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 -- re-raised below, after the judge is checked
        error = e
    _depth[0] = 0
    # First the builtins the guard uses, then the guard itself and its functions, from this frame's locals.
    tampered = []
    for name, value in _builtins:
        if _builtin_dict.get(name) is not value or name in _globals:
            tampered.append(f"builtins.{name} was rebound or shadowed")
            _builtin_dict[name] = value
            _globals.pop(name, None)
    guard, guard_code, kernel_globals = _self
    bound = (_checked, _globals, _builtins, _builtin_dict, _depth, _calls, _self)
    if kernel_globals.get("_GUARD") is not guard or guard.__code__ is not guard_code or guard.__defaults__ is None or len(
            guard.__defaults__) != len(bound) or any(a is not b for a, b in zip(guard.__defaults__, bound)):
        tampered.append("the guard (fmha.oracles.guard.guarded_call) was unhooked, rebound or recoded")
        kernel_globals["_GUARD"] = guard
        guard.__code__ = guard_code
        guard.__defaults__ = bound
    for name, fn, code, defaults in _checked:
        if _globals.get(name) is not fn or fn.__code__ is not code or fn.__defaults__ is not defaults:
            tampered.append(f"fmha.oracles.guard.{name} was rebound or recoded")
            _globals[name] = fn
            fn.__code__ = code
            fn.__defaults__ = defaults
    problems = tampered + _globals["judge_changes"]() + _globals["_modes_left"](modes)
    if error is not None:
        if problems:
            raise AssertionError(f"{entry.name}: the judge refuses this call: " + "; ".join(problems)) from error
        raise error
    with _globals["plain_torch"]():  # the outputs' bytes as memory holds them, whatever mode is active
        problems += _globals["_outputs_changed"](f"during call {number} ({entry.name})")
        problems += _globals["_not_plain"](result, args)
        if problems:
            raise AssertionError(f"{entry.name}: the judge refuses this call: " + "; ".join(problems))
        _globals["_keep"](result, f"call {number} ({entry.name})")
    return result


_GUARD_FUNCTIONS = ("release_answers", "_forget_handed_in", "judge_changes", "_outputs_changed", "_not_plain", "_keep", "_broken",
                    "_name_of", "_state", "_record_new_modules", "_record_module", "_record_value",
                    "_record_fields", "_torch_probes", "_bytes_of", "end_of_test", "_reads", "_unchanged",
                    "_torch_modes", "_modes_left", "plain_torch")
_GUARD_BUILTINS = ("len", "isinstance", "getattr", "setattr", "delattr", "hasattr", "vars", "id", "type", "tuple",
                   "list", "dict", "zip", "any", "all", "str", "repr", "object", "BaseException", "AssertionError",
                   "RuntimeError", "enumerate", "range", "reversed", "next", "iter", "callable")
guarded_call.__defaults__ = (
    tuple((name, globals()[name], globals()[name].__code__, globals()[name].__defaults__) for name in _GUARD_FUNCTIONS),
    globals(), tuple((name, vars(builtins)[name]) for name in _GUARD_BUILTINS), vars(builtins), [0], _CALLS,
    (guarded_call, guarded_call.__code__, vars(_kernel)))
_kernel.guard_calls(guarded_call)
