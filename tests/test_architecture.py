"""The layers of docs/architecture.md, read from the import graph of the installed package: no
module imports from a layer above its own, and no import cycle, imports inside functions
included (a lazy import that closes a circle is a circle all the same)."""

import ast
import functools
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS = [
    ("contract", ("fmha.contract", "fmha.tables")),
    ("kernels", ("fmha", "fmha.kernels", "fmha.adapters", "fmha.dispatch")),
    ("oracles", ("fmha.oracles",)),
    ("catalogue", ("fmha.registry",)),
    ("properties", ("fmha.properties",)),
    ("regressions", ("fmha.regressions",)),
    ("tools", ("fmha.bench",)),  # your kernel named as in pytest: the selection is the regressions'
    ("ci", ("fmha.ci",)),
]
PACKAGES = ("fmha", "fmha.oracles", "fmha.properties", "fmha.regressions", "fmha.ci")


def layer_of(module: str) -> int:
    matches = [(len(prefix), rank) for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module}: in no layer of tests/test_architecture.py"
    return max(matches)[1]


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the installed package, by name (the suite's folders install inside fmha).
    Read when a test asks, not at import: every xdist worker collects this module."""
    found = {}
    for package in PACKAGES:
        root = Path(importlib.util.find_spec(package).origin).parent
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if any(part.startswith(".") or part == "__pycache__" for part in parts):
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found.setdefault(name, path)
    return found


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(fmha module imported, at module level?) for every import in `path`; imports only for type
    checking are left out."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names if alias.name.split(".")[0] == "fmha")
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").split(".")[0] == "fmha":
                for alias in child.names:
                    submodule = f"{child.module}.{alias.name}"
                    found.append((submodule if submodule in _modules() else child.module, top))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    visit(tree, True)
    return found


@functools.cache
def _graph() -> dict[str, list[tuple[str, bool]]]:
    return {name: _imports(name, path) for name, path in _modules().items()}


def test_every_module_is_in_a_layer():
    for name in _modules():
        layer_of(name)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for name, imports in _graph().items() for target, _ in imports if layer_of(target) > layer_of(name)]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    """The first import cycle of the graph `edges` (module -> modules it imports), or []."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = "done"
        return []

    for name in sorted(edges):
        if name not in state and (found := visit(name)):
            return found
    return []


def _edges(graph) -> dict[str, set[str]]:
    return {name: {target for target, _ in imports if target != name} for name, imports in graph.items()}


def test_imports_have_no_cycle():
    cycle = _cycle(_edges(_graph()))
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_circle_closed_inside_a_function(tmp_path):
    """The check can fail: two modules whose circle is closed by a lazy import are reported."""
    (tmp_path / "a.py").write_text("from fmha.oracles.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from fmha.oracles.a import g\n")
    graph = {name: _imports(name, tmp_path / f"{name.rsplit('.', 1)[1]}.py") for name in ("fmha.oracles.a", "fmha.oracles.b")}
    assert _cycle(_edges(graph)) == ["fmha.oracles.a", "fmha.oracles.b", "fmha.oracles.a"]


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check can fail: an oracle module importing the registry is reported."""
    path = tmp_path / "bad.py"
    path.write_text("from fmha.registry import KERNELS\n")
    assert [layer_of(target) > layer_of("fmha.oracles.bad") for target, _ in _imports("fmha.oracles.bad", path)] == [True]


# -- the recipes of docs/architecture.md run as written ----------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _recipe(title: str) -> str:
    section = DOC.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_add_a_kernel_recipe_gives_an_entry_that_runs_what_it_declares(device):
    import torch

    from fmha.contract import NotSupportedError, Problem
    from fmha.oracles.check import check_sample
    from fmha.oracles.sample import Sample

    scope = {"torch": torch}
    exec(_recipe("Add a kernel"), scope)
    entry = scope["ENTRY"]
    inside = Problem(batch=2, q_len=1, kv_len=70, heads_q=4, heads_kv=2, head_dim=128)
    verdict = check_sample(entry, Sample(problem=inside), device)
    assert verdict.passed, verdict.message()
    assert entry.not_supported_reasons(inside.replace(q_len=3), device) == ["T=3 > max 1"]
    outside = Sample(problem=inside.replace(head_dim=64)).inputs(device)
    with pytest.raises(NotSupportedError, match="head dim D=64 unsupported"):
        entry(outside.q, outside.k, outside.v)


def test_the_add_a_law_recipe_is_one_record_the_suite_picks_up(monkeypatch):
    import importlib

    from hypothesis import settings

    from fmha.properties import catalog, dense_laws
    from fmha.properties.law_record import assert_agrees, law
    from fmha.oracles.check import oracle_of
    from fmha.regressions.mutants import MUTANTS
    from fmha.registry import KERNELS

    scope = {"law": law, "oracle_of": oracle_of, "assert_agrees": assert_agrees}
    exec(_recipe("Add a law"), scope)
    new = scope["q_scale_trade"]
    monkeypatch.setattr(dense_laws, "q_scale_trade", new, raising=False)
    try:
        assert importlib.reload(catalog).LAWS["q_scale_trade"] is new
        from fmha.properties import test_laws
        assert callable(getattr(importlib.reload(test_laws), new.test))
    finally:
        monkeypatch.undo()
        importlib.reload(catalog)
    quick = settings(max_examples=5, derandomize=True, database=None, deadline=None)
    new.run("cpu", KERNELS["reference"], settings=quick)
    with pytest.raises(AssertionError):
        new.run("cpu", MUTANTS[new.mutant].kernel(), settings=quick)  # the eager mutants run on the CPU


def test_the_add_an_adapter_recipe_translates_the_librarys_conventions(device):
    import math
    import types

    import torch

    from fmha.contract import Problem
    from fmha.oracles import dense_reference
    from fmha.oracles.check import check_sample
    from fmha.oracles.sample import Sample

    def forward(q, k, v, scale, causal):  # a library whose LSE is in base 2, as FlashInfer's
        o, lse = dense_reference.attention(q, k, v, scale=scale, causal=causal)
        return o.to(q.dtype), (lse / math.log(2)).float()

    scope = {"torch": torch, "library": types.SimpleNamespace(forward=forward)}
    exec(_recipe("Add an adapter"), scope)
    entry = scope["ENTRIES"][0]
    sample = Sample(problem=Problem(batch=1, q_len=5, kv_len=40, heads_q=4, heads_kv=2, head_dim=64, causal=True))
    verdict = check_sample(entry, sample, device)
    assert verdict.passed, verdict.message()
    assert "window" in " ".join(entry.not_supported_reasons(sample.problem.replace(window=4), device))


# -- one definition each ------------------------------------------------------------------------

SELECTION_OPTIONS = ("--fmha-kernel", "--fmha-device")


def _declarations(tree) -> set[str]:
    """The selection options `tree` declares: passed to add_argument/addoption, or a key of an
    options mapping."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("add_argument", "addoption"):
            found |= {arg.value for arg in node.args if isinstance(arg, ast.Constant) and arg.value in SELECTION_OPTIONS}
        if isinstance(node, ast.Dict):
            found |= {key.value for key in node.keys if isinstance(key, ast.Constant) and key.value in SELECTION_OPTIONS}
    return found


def test_the_kernel_and_device_options_are_declared_in_one_module():
    declaring = {name: sorted(found) for name, path in _modules().items()
                 if (found := _declarations(ast.parse(path.read_text())))}
    assert declaring == {"fmha.regressions.selection": sorted(SELECTION_OPTIONS)}, declaring


def test_the_declaration_check_sees_a_second_declaration():
    """The check can fail: a command declaring --fmha-device itself is seen."""
    tree = ast.parse('parser.add_argument("--fmha-device", choices=("cpu", "cuda"))\n')
    assert _declarations(tree) == {"--fmha-device"}


def test_every_mutant_is_one_record():
    from fmha.regressions.mutants import MUTANTS
    from fmha.regressions.mutation import Mutant

    assert MUTANTS and all(isinstance(m, Mutant) and m.name == name for name, m in MUTANTS.items())


def _holders(modules) -> dict[str, set[Path]]:
    """Mutant name -> the files of those of `modules` that hold its record (alone or in a tuple)."""
    from fmha.regressions.mutation import Mutant

    held: dict[str, set[Path]] = {}
    for module in modules:
        for value in vars(module).values():
            for record in value if isinstance(value, tuple) else (value,):
                if isinstance(record, Mutant):
                    held.setdefault(record.name, set()).add(Path(module.__file__))
    return held


def _names_not_in_their_files(modules) -> list[str]:
    """Mutants whose name no file of a module holding them spells out as a string: grepping the
    name a failure prints finds no definition."""
    return sorted(name for name, files in _holders(modules).items()
                  if not any(re.search(rf"""["']{re.escape(name)}["']""", f.read_text()) for f in files))


def _mutant_modules() -> list:
    import pkgutil

    from fmha import regressions
    from fmha.regressions import traps

    return [*(importlib.import_module(f"fmha.regressions.{m.name}") for m in pkgutil.iter_modules(regressions.__path__)
              if m.name.endswith("_mutants")), *traps._modules()]


def test_every_mutants_name_is_spelled_out_where_it_is_defined():
    from fmha.regressions.mutants import MUTANTS

    modules = _mutant_modules()
    assert len({m.__name__ for m in modules}) > 30, "every family's module and every trap's"
    assert not _names_not_in_their_files(modules)
    unheld = set(MUTANTS) - set(_holders(modules))
    assert not unheld, f"records no module holds: {unheld}"


def test_the_name_check_sees_a_generated_name(tmp_path):
    """The check can fail: a mutant whose name is built from a function's (as `name.replace("_",
    "-")` once built them) is seen."""
    source = tmp_path / "made_mutants.py"
    source.write_text("from fmha.regressions.mutation import Mutant\n"
                      "def table_read_twice(): ...\n"
                      "MUTANTS = (Mutant(table_read_twice.__name__.replace('_', '-'), '', 'a bug', lambda: None),\n"
                      "           Mutant('spelled-out', '', 'a bug', lambda: None))\n")
    spec = importlib.util.spec_from_file_location("made_mutants", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _names_not_in_their_files([module]) == ["table-read-twice"]


# Old import paths: users import them, so each is the module under its new name, with a warning.
RENAMED = {"fmha.oracles.reference": "fmha.oracles.dense_reference"}


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_an_old_import_path_is_its_module_under_the_new_name_and_warns(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(new)):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


# -- the page is true to the code ----------------------------------------------------------------

_PATH = re.compile(r"\b(?:fmha|oracles|properties|regressions|ci|tests|docs)/[\w/.-]*\w")
_DOTTED = re.compile(r"`((?:fmha\.)?[a-z_]+(?:\.[a-z_]+)*\.[A-Za-z_]\w*)`")
WRITTEN_BY_THE_RECIPES = {"regressions/traps/window_edge.py"}  # what `regressions new` writes


def _missing_paths(text: str) -> list[str]:
    root = DOC.parents[1]
    return sorted(p for p in set(_PATH.findall(text)) - WRITTEN_BY_THE_RECIPES if not (root / p).exists())


def _missing_functions(text: str) -> list[str]:
    """`module.function` tokens (a module by its full or last name) whose module lacks the function."""
    by_last = {}
    for name in _modules():
        by_last.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    missing = []
    for token in set(_DOTTED.findall(text)) - set(_modules()):  # a module that exists is not a missing function
        module_name, _, attr = token.rpartition(".")
        candidates = [module_name] if module_name in _modules() else by_last.get(module_name, [])
        if len(candidates) == 1 and not hasattr(importlib.import_module(candidates[0]), attr):
            missing.append(token)  # (not a module: a class's method, or a name several modules share)
    return sorted(missing)


def test_every_path_and_function_the_architecture_page_names_exists():
    text = DOC.read_text()
    assert len(set(_PATH.findall(text))) > 40, "the page names the files of each layer and data path"
    assert not _missing_paths(text), f"docs/architecture.md names paths that do not exist: {_missing_paths(text)}"
    assert not _missing_functions(text), f"docs/architecture.md names functions that do not exist: {_missing_functions(text)}"


def test_the_page_check_sees_what_is_gone():
    text = "The oracle lives in oracles/key_sources.py (`oracle.oracle_over`, `nightly.no_such_step`).\n"
    assert _missing_paths(text) == ["oracles/key_sources.py"]
    assert _missing_functions(text) == ["nightly.no_such_step"]


# -- the README's kernel list is the dispatch order ------------------------------------------------

def _readme_priority_list(text: str) -> list[str]:
    """The kernel names of the README's bullet list after "in priority order:"."""
    after = text.split("in priority order:\n", 1)[1].lstrip("\n")
    names = []
    for line in after.splitlines():
        if not line.startswith(("- ", "  ")):
            break
        if line.startswith("- `"):
            names.append(line[3:].split("`")[0])
    return names


def test_the_readmes_kernels_are_listed_in_dispatch_order():
    """The README's list is what `fmha.attention` tries, in its order (fmha.dispatch.IMPLEMENTATIONS)."""
    from fmha.dispatch import IMPLEMENTATIONS

    listed = _readme_priority_list((Path(__file__).resolve().parents[1] / "README.md").read_text())
    assert listed == [entry.name for entry in IMPLEMENTATIONS], (
        f"README.md lists {listed} in priority order; fmha.dispatch.IMPLEMENTATIONS runs "
        f"{[entry.name for entry in IMPLEMENTATIONS]}: reorder the README's list")


def test_the_priority_check_sees_a_reordered_list():
    text = "in priority order:\n\n- `gluon-sparse` (`gluon_sparse.py`): one\n  more\n- `cuda-sparse` (x): two\n\nAll keep\n"
    assert _readme_priority_list(text) == ["gluon-sparse", "cuda-sparse"]


def test_the_readmes_folders_install_as_pyproject_says():
    """The README's table of folders says what each installs as, as pyproject.toml's package-dir does."""
    from fmha.regressions.ledger import tomllib  # tomli before Python 3.11

    root = Path(__file__).resolve().parents[1]
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    rows = re.findall(r"^\| `([\w/]+)/` \| `([\w.]+)` \|", (root / "README.md").read_text(), re.M)
    def folder_of(package: str) -> str:  # the longest package-dir entry it is inside
        base = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
        return "/".join([package_dir[base], *package[len(base):].split(".")[1:]])

    assert {p for _, p in rows} >= set(package_dir), (rows, package_dir)
    wrong = {f"{folder}/": f"{package} is in {folder_of(package)}/" for folder, package in rows if folder_of(package) != folder}
    assert not wrong, f"README.md's table of folders: {wrong} (pyproject.toml, [tool.setuptools.package-dir])"


# -- no hypothesis deadline ----------------------------------------------------------------------

REPOSITORY = Path(__file__).resolve().parents[1]


def _settings_calls(tree: ast.Module) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        isinstance(node.func, ast.Name) and node.func.id == "settings"
        or isinstance(node.func, ast.Attribute) and node.func.attr == "settings"
        and isinstance(node.func.value, ast.Name) and node.func.value.id == "hypothesis")]


def _with_a_deadline(tree: ast.Module) -> list[int]:
    """Lines of hypothesis `settings(...)` calls that may keep hypothesis's 200 ms deadline: no
    `deadline=None`, and no parent that is a module-level name bound to a call that has it. (A
    kernel's first call compiles it: a deadline fails it for the compile, as one once did on a GPU.)"""
    parents = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
               for target in node.targets if isinstance(target, ast.Name) and isinstance(node.value, ast.Call)}

    def without(call: ast.Call, seen=()) -> bool:
        if any(k.arg == "deadline" and isinstance(k.value, ast.Constant) and k.value.value is None
               for k in call.keywords):
            return False
        parent = call.args[0] if call.args else None
        if isinstance(parent, ast.Name) and parent.id in parents and parent.id not in seen:
            return without(parents[parent.id], (*seen, parent.id))
        return True

    return [call.lineno for call in _settings_calls(tree) if without(call)]


def test_no_hypothesis_settings_keeps_a_deadline():
    paths = [p for p in REPOSITORY.rglob("*.py")
             if not any(part.startswith(".") for part in p.relative_to(REPOSITORY).parts)]
    assert len(paths) > 100, f"read {len(paths)} files from {REPOSITORY}"
    found = {str(p.relative_to(REPOSITORY)): lines for p in paths
             if (lines := _with_a_deadline(ast.parse(p.read_text())))}
    assert not found, f"hypothesis settings without deadline=None (file: lines): {found}"


def test_the_deadline_check_sees_a_settings_without_deadline_none():
    tree = ast.parse("QUICK = settings(max_examples=3, deadline=None)\nSLOW = settings(max_examples=3)\n"
                     "a = settings(QUICK, phases=[])\nb = settings(SLOW, phases=[])\nc = hypothesis.settings()\n")
    assert _with_a_deadline(tree) == [2, 4, 5]
