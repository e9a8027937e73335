"""Dependencies point one way: theory ← parallel (the library) ← strategies, config ← train ← cli.

`partrain_edu.parallel` must load without the course harness (the loop, the CLI, the strategy registry), so a
learner can use its pieces on any model; `theory` must never need torch; the strategy index in
`partrain_edu.strategies` must name exactly the strategies that register.
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


def test_harness_layers_point_one_way():
    # strategies never import the loop or the CLI; the loop never imports the CLI (not even lazily);
    # the config the CLI builds its parser from imports none of them.
    for path in sorted((PACKAGE / "strategies").glob("*.py")):
        assert imports_any(path, ("partrain_edu.train", "partrain_edu.cli")) == [], path.name
    assert imports_any(PACKAGE / "train.py", ("partrain_edu.cli",)) == []
    assert imports_any(PACKAGE / "config.py", ("partrain_edu.train", "partrain_edu.cli", "partrain_edu.strategies")) == []


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
    registered = {name: cls.__module__ for name, cls in strategies().items()}
    assert registered == index_rows()
    assert set(strategies_pkg.STRATEGY_MODULES) == set(registered.values())
