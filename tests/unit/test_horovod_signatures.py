"""Every name Horovod 0.28.1 exports from its framework modules exists at the same path under unison,
and accepts the same parameters, by name and in the same positions, with equal defaults.

The reference, tests/data/horovod-signatures.json, lists each exported name of horovod.torch,
horovod.tensorflow, horovod.tensorflow.keras, horovod.keras and their callbacks and elastic
submodules: its kind, and for callables its parameters in order with their defaults as source text.
horovod.X maps to unison.X. unison may add parameters after Horovod's, with defaults. Where unison
differs on purpose, `EXCEPTIONS` says why (docs/migrating-from-horovod.md says the same for users),
and the case asserts that exact difference, so one that changes or goes away must leave the list.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorflow")
pytest.importorskip("keras")


ROOT = Path(__file__).resolve().parents[2]
SIGNATURES: dict[str, dict[str, Any]] = json.loads(
    (ROOT / "tests" / "data" / "horovod-signatures.json").read_text())
GUIDE = ROOT / "docs" / "migrating-from-horovod.md"

# `horovod.run` (top level, in no framework module) is not in the json: its parameters as listed in
# Horovod's API reference. unison.run keeps its own `timeout`, `env` and `mpiexec` after them.
RUN_PARAMETERS = [
    ("func", None), ("args", "()"), ("kwargs", "None"), ("num_proc", "1"), ("min_num_proc", "None"),
    ("max_num_proc", "None"), ("slots", "None"), ("reset_limit", "None"), ("cooldown_range", "None"),
    ("hosts", "None"), ("hostfile", "None"), ("host_discovery_script", "None"), ("start_timeout", "None"),
    ("ssh_port", "None"), ("ssh_identity_file", "None"), ("disable_cache", "None"),
    ("output_filename", "None"), ("verbose", "None"), ("use_gloo", "None"), ("use_mpi", "None"),
    ("mpi_args", "None"), ("network_interface", "None"), ("network_interfaces", "None"),
    ("executable", "None"), ("np", "None"), ("min_np", "None"), ("max_np", "None"),
]
SIGNATURES = {**SIGNATURES, "horovod": {"run": {
    "kind": "function", "module": "horovod.runner",
    "params": [{"name": n, "kind": "positional", "default": d} for n, d in RUN_PARAMETERS]}}}

# Horovod's torch `init`/`shutdown` take (*args, **kwargs) only to pass them on to the common
# basics; what they accept is the basics' signature, so that is what unison's must match.
FORWARDED = {
    "init": [{"name": "comm", "kind": "positional", "default": "None"},
             {"name": "process_sets", "kind": "positional", "default": "None"}],
    "shutdown": [],
}

ELASTIC_MODULES = sorted(m for m in SIGNATURES if m.endswith(".elastic"))
_INTERNAL = ("a helper of Horovod's own implementation that its module imports for itself; no training "
             "script calls it through hvd")

# Deliberate differences: '<horovod module>.<name>' -> (why, the difference the check reports, which
# the case asserts instead). docs/migrating-from-horovod.md has a row for each one.
EXCEPTIONS: dict[str, tuple[str, str]] = {
    # Horovod's implementation details, visible only because its modules import them.
    **{f"{module}.{name}": (_INTERNAL, f"has no {name!r}") for module, name in [
        ("horovod.torch", "check_extension"),
        ("horovod.tensorflow", "check_extension"),
        ("horovod.tensorflow", "check_num_rank_power_of_2"),
        ("horovod.tensorflow", "split_list"),
        ("horovod.tensorflow", "refs_to_vars"),
        ("horovod.tensorflow", "vars_to_refs"),
        ("horovod.tensorflow", "handle_average_backwards_compatibility"),
        ("horovod.tensorflow", "LocalGradientAggregationHelper"),
        ("horovod.tensorflow.keras", "is_version_greater_equal_than"),
        ("horovod.tensorflow.keras.callbacks", "is_version_greater_equal_than"),
    ]},
    # horovod.keras.allreduce defaults to average=True, with which op= raises ('The op parameter
    # supersedes average'); unison's None means the same Average and lets op= be given alone.
    "horovod.keras.allreduce": ("average defaults to None (Average), so that op= works alone",
                                "parameter 'average' defaults to None; Horovod's is True"),
    # Horovod's default is 1 process; unison.run started 2 unless told before it took horovod.run's
    # arguments (docs/launcher.md), and keeps that default.
    "horovod.run": ("num_proc defaults to None: the slots of hosts/hostfile, else 2 processes",
                    "parameter 'num_proc' defaults to None; Horovod's is 1"),
}


# The module paths user code imports Horovod's names from (``from horovod.torch.mpi_ops import
# synchronize``): where Horovod defines what its framework modules export (each entry's "module" in
# the json), plus the names those modules also hold that scripts import from them. Each unison path
# must import and hold the same object as the framework module.
_BASICS = sorted(name for name, entry in SIGNATURES["horovod.torch"].items()
                 if entry and entry.get("module", "").endswith("HorovodBasics"))
_PROCESS_SETS = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
EXTRA_MODULE_NAMES: dict[str, dict[str, str]] = {
    "horovod.torch.mpi_ops": {n: "horovod.torch" for n in [*_BASICS, *_PROCESS_SETS, "is_homogeneous"]},
    "horovod.tensorflow.mpi_ops": {n: "horovod.tensorflow" for n in [*_BASICS, *_PROCESS_SETS,
                                                                     "is_homogeneous", "gpu_available"]},
    "horovod.common.exceptions": {"HostsUpdatedInterrupt": "horovod.torch.elastic"},
    "horovod.common.elastic": {"State": "horovod.torch.elastic"},
    "horovod.common.util": {"gpu_available": "horovod.tensorflow"},
    "horovod.runner": {"run": "horovod"},
}


def _module_paths() -> dict[str, dict[str, str]]:
    """Horovod module path -> {name: the framework module whose unison equivalent holds it}."""
    paths: dict[str, dict[str, str]] = {}
    for module, names in SIGNATURES.items():
        for name, entry in names.items():
            where = (entry or {}).get("module", "")
            if not where.startswith("horovod.") or where.endswith("HorovodBasics") or where == "horovod.runner":
                continue
            if f"{module}.{name}" in EXCEPTIONS and EXCEPTIONS[f"{module}.{name}"][0] == _INTERNAL:
                continue  # an implementation helper: no script imports it
            paths.setdefault(where, {}).setdefault(name, module)
    for where, names in EXTRA_MODULE_NAMES.items():
        paths.setdefault(where, {}).update(names)
    return paths


MODULE_PATHS = _module_paths()


def unison_name(horovod_module: str) -> str:
    """horovod.tensorflow.keras -> unison.tensorflow.keras."""
    return "unison" + horovod_module[len("horovod"):]


_UNRESOLVED = object()


def _resolve(expression: str, module: Any) -> Any:
    """The value a default written as source text stands for, seen from the unison module.

    Literals (numbers, strings, None, True/False, tuples) are evaluated; a dotted name such as
    ``Compression.none``, ``Average`` or ``global_process_set`` is looked up in the unison module
    (then in `unison` itself). Anything else cannot be compared and yields `_UNRESOLVED`.
    """
    try:
        return ast.literal_eval(expression)
    except (ValueError, SyntaxError):
        pass
    for base in (module, importlib.import_module("unison")):
        value: Any = base
        for part in expression.split("."):
            if not part.isidentifier() or not hasattr(value, part):
                break
            value = getattr(value, part)
        else:
            return value
    return _UNRESOLVED


def _default_problem(name: str, theirs: str | None, ours: Any, module: Any) -> str | None:
    if theirs is None:
        return None if ours is inspect.Parameter.empty else (
            f"parameter {name!r} has default {ours!r}; Horovod's has none")
    if ours is inspect.Parameter.empty:
        return f"parameter {name!r} has no default; Horovod's is {theirs}"
    want = _resolve(theirs, module)
    if want is _UNRESOLVED:
        return None  # an expression naming nothing unison has: that name's own case fails instead
    if want is ours or (type(want) is type(ours) and want == ours):
        return None
    return f"parameter {name!r} defaults to {ours!r}; Horovod's is {theirs}"


def signature_problems(obj: Any, params: list[dict[str, Any]], module: Any, name: str) -> list[str]:
    """Differences between `obj`'s signature and Horovod's `params` (empty when compatible)."""
    if [p["kind"] for p in params] == ["*args", "**kwargs"] and name in FORWARDED:
        params = FORWARDED[name]
    ours = list(inspect.signature(obj).parameters.values())
    kind = inspect.Parameter
    positional = [p for p in ours if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
    problems = []
    position = 0
    for theirs in params:
        if theirs["kind"] == "*args":
            if not any(p.kind is kind.VAR_POSITIONAL for p in ours):
                problems.append("takes no *args; Horovod's does")
            continue
        if theirs["kind"] == "**kwargs":
            if not any(p.kind is kind.VAR_KEYWORD for p in ours):
                problems.append("takes no **kwargs; Horovod's does")
            continue
        if position >= len(positional):
            problems.append(f"has no positional parameter {theirs['name']!r} at position {position}")
            continue
        p = positional[position]
        position += 1
        if p.name != theirs["name"]:
            problems.append(f"position {position - 1} is {p.name!r}; Horovod's is {theirs['name']!r}")
            continue
        if p.kind is kind.POSITIONAL_ONLY:
            problems.append(f"parameter {p.name!r} is positional-only; Horovod's is also a keyword")
        problem = _default_problem(p.name, theirs.get("default"), p.default, module)
        if problem:
            problems.append(problem)
    for p in ours:
        extra = p in positional[position:] or p.kind is kind.KEYWORD_ONLY
        if extra and p.default is kind.empty:
            problems.append(f"adds parameter {p.name!r} without a default; Horovod's callers do not pass it")
    return problems


def check_conformance(horovod_module: str, name: str, entry: dict[str, Any] | None) -> None:
    module = importlib.import_module(unison_name(horovod_module))
    if entry is None:  # a submodule in Horovod: importable by its path, and the same object as the attribute
        submodule = importlib.import_module(f"{module.__name__}.{name}")
        assert getattr(module, name) is submodule
        return
    assert hasattr(module, name), f"{module.__name__} has no {name!r}"
    obj = getattr(module, name)
    if entry["kind"] == "class":
        assert isinstance(obj, type), f"{module.__name__}.{name} is {obj!r}, not a class"
    elif entry["kind"] == "function":
        assert callable(obj), f"{module.__name__}.{name} is {obj!r}, not callable"
    if entry["kind"] == "value" or entry.get("params") is None:
        return
    problems = signature_problems(obj, entry["params"], module, name)
    assert not problems, f"{module.__name__}.{name}: " + "; ".join(problems)


def _cases() -> list[Any]:
    return [pytest.param(horovod_module, name, entry, id=f"{horovod_module}.{name}")
            for horovod_module, names in SIGNATURES.items() for name, entry in names.items()]


@pytest.mark.parametrize(("horovod_module", "name", "entry"), _cases())
def test_name_matches_horovod(horovod_module: str, name: str, entry: dict[str, Any] | None) -> None:
    exception = EXCEPTIONS.get(f"{horovod_module}.{name}")
    if exception is None:
        check_conformance(horovod_module, name, entry)
        return
    # A deliberate difference: it must still be exactly the one listed (a fixed one leaves the list).
    _, difference = exception
    with pytest.raises((AssertionError, ImportError), match=re.escape(difference)):
        check_conformance(horovod_module, name, entry)


@pytest.mark.parametrize("horovod_module", sorted(MODULE_PATHS))
def test_module_path_imports_the_same_objects(horovod_module: str) -> None:
    module = importlib.import_module(unison_name(horovod_module))
    for name, exporter in sorted(MODULE_PATHS[horovod_module].items()):
        assert hasattr(module, name), f"{module.__name__} has no {name!r}"
        if exporter == "horovod":
            expected = getattr(importlib.import_module("unison"), name)
        else:
            expected = getattr(importlib.import_module(unison_name(exporter)), name)
        assert getattr(module, name) is expected, f"{module.__name__}.{name} is not {unison_name(exporter)}.{name}"


def test_module_paths_cover_horovods_own() -> None:
    # The paths users import from, among them the ones the examples and Horovod's tests use.
    for path in ("horovod.torch.mpi_ops", "horovod.tensorflow.mpi_ops", "horovod.torch.functions",
                 "horovod.torch.compression", "horovod.torch.optimizer", "horovod.torch.sync_batch_norm",
                 "horovod.torch.elastic.sampler", "horovod.torch.elastic.state",
                 "horovod.tensorflow.functions", "horovod.tensorflow.compression",
                 "horovod.tensorflow.sync_batch_norm", "horovod.common.exceptions",
                 "horovod.common.process_sets", "horovod.common.util", "horovod.common.elastic",
                 "horovod.runner"):
        assert path in MODULE_PATHS, path
    assert "synchronize" in MODULE_PATHS["horovod.torch.mpi_ops"]


def test_gpu_available_answers_for_each_framework() -> None:
    import torch

    import unison.tensorflow as hvd
    from unison.errors import InvalidArgumentError

    # asked in a child process: torch sees a GPU and unison's GPU data plane (CuPy) can run
    assert hvd.gpu_available("torch") is (torch.cuda.is_available() and hvd.cuda_built())
    assert hvd.gpu_available("mxnet") is False
    with pytest.raises(InvalidArgumentError, match=r"one of 'torch', 'tensorflow', 'mxnet'. Got 'jax'"):
        hvd.gpu_available("jax")


def test_exceptions_name_real_cases() -> None:
    known = {f"{m}.{name}" for m, names in SIGNATURES.items() for name in names}
    assert sorted(set(EXCEPTIONS) - known) == []


def test_every_exception_is_explained_in_the_guide() -> None:
    guide = GUIDE.read_text()
    unexplained = [case for case in EXCEPTIONS if f"`{case}`" not in guide]
    assert unexplained == []
    assert all(f"`{unison_name(m)}`" in guide for m in ELASTIC_MODULES)


def test_the_checker_finds_differences() -> None:
    # The checker itself: each rule it applies reports a deliberately wrong signature.
    def wrong(b: int, a: int = 2, *, c: int) -> None: ...

    params = [{"name": "a", "kind": "positional", "default": None},
              {"name": "b", "kind": "positional", "default": "1"},
              {"name": "x", "kind": "**kwargs", "default": None}]
    problems = signature_problems(wrong, params, None, "wrong")
    assert any("position 0 is 'b'" in p for p in problems)
    assert any("no positional parameter" in p for p in problems) is False
    assert any("**kwargs" in p for p in problems)
    assert any("'c' without a default" in p for p in problems)

    def defaults(a: int = 2, b: str = "x", c: bool = True, d: Any = None) -> None: ...

    params = [{"name": n, "kind": "positional", "default": d} for n, d in
              [("a", "1"), ("b", "'x'"), ("c", "1"), ("d", None)]]
    problems = signature_problems(defaults, params, None, "defaults")
    assert problems == ["parameter 'a' defaults to 2; Horovod's is 1",
                        "parameter 'c' defaults to True; Horovod's is 1",
                        "parameter 'd' has default None; Horovod's has none"]
