"""Dependencies point one way, layer by layer (LAYERS), and no module imports itself back through others.

    units ← theory ← data/models ← comm/topology ← runtime/emulated ← parallel | launcher ← config ← strategies
          ← train/checkpoint ← notebook/netem/lessons/grading/viz/problems ← cli

An import, at the top or lazily inside a function, may only reach its own layer or one below; `parallel` (the
library) and `launcher` are siblings that never import each other. `partrain_edu.parallel` must load without the
course harness, so a learner can use its pieces on any model; `theory` must never need torch; the strategy index
in `partrain_edu.strategies` must name exactly the strategies that register.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

import partrain_edu
import partrain_edu.strategies as strategies_pkg
from partrain_edu.strategies import strategies

PACKAGE = Path(partrain_edu.__file__).parent
HARNESS = ("partrain_edu.train", "partrain_edu.cli", "partrain_edu.strategies", "partrain_edu.config",
           "partrain_edu.models")


# Each top-level name of the package in its layer; an import may reach its own layer or one below.
LAYERS = [("units",), ("theory",), ("data", "models"), ("comm", "topology"), ("runtime", "emulated"),
          ("parallel", "launcher"), ("config", "train_checks"), ("strategies",),
          ("train", "checkpoint", "checkpoint_files", "benchmarking", "oracle", "gaps", "progress"),
          ("notebook", "netem", "lessons", "grading", "viz", "workspace", "problems"), ("cli", "__main__")]
SIBLINGS = {"parallel", "launcher"}  # one layer, and neither imports the other


def package_modules() -> dict[str, Path]:
    """{"partrain_edu.launcher.warm.pool": path, ...} for every module of the package (a package is its __init__)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (`from partrain_edu import runtime` is an edge to runtime; the
    bare package `partrain_edu`, a docstring and a version, is no layer and no edge)."""
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        reached = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                reached.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                inner = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                reached.update(inner or {node.module})
        graph[name] = {m for m in reached if m in modules and m not in (name, "partrain_edu")}
    return graph


def layer_of(module: str) -> tuple[int, str]:
    top = module.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if top in names), top


def test_every_module_sits_in_a_layer():
    unplaced = {m for m in package_modules() if m != "partrain_edu" and not any(m.split(".")[1] in names
                                                                             for names in LAYERS)}
    assert unplaced == set(), "add these to LAYERS (and to the README's tree)"


def test_every_import_points_down_the_layers():
    upward = []
    for module, reached in import_graph().items():
        if module == "partrain_edu":
            continue
        (mine, top) = layer_of(module)
        for target in reached:
            (theirs, other) = layer_of(target)
            if theirs > mine or (theirs == mine and top != other and {top, other} <= SIBLINGS):
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_the_import_graph_has_no_cycle():
    graph, state, cycles = import_graph(), {}, []

    def visit(module: str, path: list[str]) -> None:   # depth first; a grey module met again closes a cycle
        state[module] = "grey"
        for target in sorted(graph[module]):
            if state.get(target) == "grey":
                cycles.append(path[path.index(target):] + [target] if target in path else [module, target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "black"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_no_module_of_the_package_root_hides_behind_an_underscore():
    assert sorted(p.name for p in PACKAGE.glob("_*.py") if p.name not in ("__init__.py", "__main__.py")) == []


def test_no_file_of_the_package_is_over_300_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}


# Packs left on purpose, each in a file at its line cap: (path in the package, its targets).
PACKED_AT_A_LINE_CAP = {("parallel/fsdp_naive.py", "self.module, self.group, self.n, self.again")}   # 80 lines


def dotted(node: ast.AST) -> str | None:
    """`self.a.b` for an attribute chain on a name, the name for a name; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def bound(target: ast.AST) -> set[str]:
    """The names and attribute chains an assignment target binds (a subscript binds none)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(bound(t) for t in target.elts))
    if isinstance(target, ast.Starred):
        return bound(target.value)
    return {dotted(target)} - {None}


def packed_assignments(tree: ast.AST, least: int = 3) -> list[tuple[int, str]]:
    """(line, targets) of each `a, b, c = x, y, z` binding `least` or more names from a literal tuple, but a
    simultaneous update: a right-hand side that reads what the statement binds (`a, b, c = b, a + b, c`)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)):
            continue
        reads = {dotted(n) for n in ast.walk(node.value) if isinstance(n, (ast.Name, ast.Attribute))}
        for target in node.targets:
            if isinstance(target, ast.Tuple) and len(target.elts) == len(node.value.elts) >= least \
                    and not reads & set().union(*(bound(t) for t in node.targets)):
                found.append((node.lineno, ", ".join(ast.unparse(t) for t in target.elts)))
    return found


def test_no_packed_assignment_hides_what_changes():
    sample = "a, b, c = 1, f(), []\na, b, c = b, a + b, c\nself.x, self.y, z = self.y, 0, 1\nx.a, y, z = x, 0, 1\n"
    assert packed_assignments(ast.parse(sample)) == [(1, "a, b, c"), (4, "x.a, y, z")]
    packed = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
              for line, targets in packed_assignments(ast.parse(path.read_text(), filename=str(path)))
              if (path.relative_to(PACKAGE).as_posix(), targets) not in PACKED_AT_A_LINE_CAP]
    assert packed == [], f"one statement per line: split it: {', '.join(packed)}"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or lazily inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from partrain_edu import train`
    return names


def imports_any(path: Path, modules) -> list[str]:
    return sorted(n for n in imported_modules(path) for m in modules if n == m or n.startswith(m + "."))


def library_files() -> list[Path]:
    return sorted((PACKAGE / "parallel").glob("*.py"))


def fresh_import(modules: list[str], watch: tuple[str, ...]) -> dict[str, list[str]]:
    """Import `modules` one by one in a new interpreter; after each, which of `watch` are loaded."""
    code = ("import importlib, json, sys\nseen = {}\n"
            "for name in sys.argv[2:]:\n"
            "    importlib.import_module(name)\n"
            "    seen[name] = [w for w in json.loads(sys.argv[1]) if w in sys.modules]\n"
            "print(json.dumps(seen))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(watch), *modules], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_library_file_imports_the_harness():
    offenders = {p.name: imports_any(p, HARNESS) for p in library_files()}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_library_loads_without_the_harness_and_its_index_without_torch():
    modules = ["partrain_edu.parallel"] + [f"partrain_edu.parallel.{p.stem}" for p in library_files()
                                           if p.name != "__init__.py"]
    seen = fresh_import(modules, HARNESS + ("torch",))
    assert seen.pop("partrain_edu.parallel") == []       # the index imports nothing heavy
    # The first module after which a harness module is loaded is the one that imported it.
    assert {m: [w for w in found if w != "torch"] for m, found in seen.items()} == {m: [] for m in seen}


def test_the_library_index_lists_every_module():
    import partrain_edu.parallel as parallel

    assert sorted(parallel.__all__) == sorted(p.stem for p in library_files() if p.name != "__init__.py")


def grading_imports() -> dict[str, set[str]]:
    """{module of partrain_edu.grading: the grading modules it imports, at the top or lazily}; the checks package
    imports each of its modules (checks.load_all)."""
    files = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (PACKAGE / "grading").rglob("*.py")}
    graph = {m: {n for n in imported_modules(p) if n in files and n != m} for m, p in files.items()}
    graph["partrain_edu.grading.checks"] |= {m for m in files if m.count(".") == 3 and ".checks." in m}
    return graph


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen


def test_grading_has_no_import_cycle_and_the_learner_path_no_headless_grader():
    graph = grading_imports()
    assert sorted(m for m in graph if m in reached(graph, m)) == []
    assert {m for m, imported in graph.items() if "partrain_edu.grading.checks" in imported} == \
        {"partrain_edu.grading.runner"}                      # the one module that loads the checks
    learner = {"partrain_edu.grading", "partrain_edu.grading.rank_main"}   # check(), and what its ranks run
    learner |= {m for start in learner for m in reached(graph, start)}
    assert "partrain_edu.grading.checks.ring_all_reduce" in learner
    assert sorted(m for m in learner if ".headless" in m or ".authoring" in m) == []


def test_the_command_line_parser_does_not_load_torch():
    assert fresh_import(["partrain_edu.cli"], ("torch",)) == {"partrain_edu.cli": []}


def test_a_rank_loads_only_its_own_strategys_torch_modules():
    # DTensor, FSDP2 and pipelining cost about 2 s of imports a rank: a rank of our own pieces never pays them
    heavy = ("torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed.pipelining", "torch._dynamo")
    ours = ["single", "ddp", "naive_dp", "tensor", "pipeline", "zero", "fsdp", "hybrid", "context", "torch_ddp"]
    modules = ["partrain_edu.train"] + [f"partrain_edu.strategies.{m}" for m in ours]
    assert fresh_import(modules, heavy) == {m: [] for m in modules}
    assert fresh_import(["partrain_edu.strategies.torch_pp"], heavy)["partrain_edu.strategies.torch_pp"] != []


def test_theory_never_imports_torch():
    files = sorted((PACKAGE / "theory").glob("*.py"))
    assert {p.name: imports_any(p, ("torch",)) for p in files} == {p.name: [] for p in files}
    modules = [f"partrain_edu.theory.{p.stem}" for p in files if p.name != "__init__.py"]
    assert fresh_import(modules, ("torch",)) == {m: [] for m in modules}


def index_rows() -> dict[str, str]:
    """{strategy: module} from the table in `partrain_edu.strategies`' docstring."""
    rows = {}
    for line in strategies_pkg.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] != "strategy":
            rows[cells[0]] = "partrain_edu." + cells[1]
    return rows


def test_the_strategy_index_is_the_registry():
    strategies()                                   # imports every module of the index: all registered
    registered = {name: cls.__module__ for name, cls in strategies_pkg.STRATEGIES.items()}
    assert registered == index_rows()
    assert {name: f"partrain_edu.strategies.{module}" for name, module in strategies_pkg.STRATEGY_MODULES.items()} \
        == registered
