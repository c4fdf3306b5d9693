"""The package's dependencies point one way, checked on the source with `ast`:
- loraplex/contract.py imports nothing of loraplex;
- no module-level import in routing/, admission/, metrics/, accounting/, registry/ or tenancy/
  reaches into engine/ or ingress/ (those two sit above them);
- each package owns its settings in its config.py, which the root config.py composes: the root
  config is read at run time only by the top (app.py, observability/'s generators, which load a
  whole serve config); the packages below import it for annotations only (`if TYPE_CHECKING:`);
- no import cycle between the package's parts (each subpackage, each package's config.py, and
  each top-level module such as config.py, is one part: a package's config.py sits below the root
  config, the package's code may sit above it). Module-level imports count, inside functions
  too: a lazy import still runs. `if TYPE_CHECKING:` blocks do not (they never run);
- no import cycle between files at all: no file imports one that imports it back, directly or
  around a circle, counting imports inside functions and under `if TYPE_CHECKING:` too (a reader
  follows those as well, and a lazy import that breaks a cycle only hides it)."""
import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "platform" / "loraplex"
LOWER = ("routing", "admission", "metrics", "accounting", "registry", "tenancy")


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part(module: str) -> str:
    """The part of the package a module belongs to: its subpackage (a subpackage's config.py is
    a part of its own), or itself at the top."""
    name = module.split(".")
    if len(name) == 3 and name[2] == "config" and (PKG / name[1]).is_dir():
        return f"{name[1]}.config"
    return name[1] if len(name) > 2 or (len(name) == 2 and (PKG / name[1]).is_dir()) else "loraplex"


def is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path, module_level_only: bool, type_checking: bool = False) -> list[str]:
    """The loraplex modules `path` imports (`from a import b` as a.b when b is a module);
    `type_checking`: those under `if TYPE_CHECKING:` too."""
    out = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child) and not type_checking:
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and module_level_only:
                continue
            if isinstance(child, ast.Import):
                out.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    is_module = (PKG.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                        (PKG.parent / Path(*sub.split("."))).is_dir()
                    out.append(sub if is_module else child.module)
            visit(child, top)

    visit(ast.parse(path.read_text()), True)
    return [m for m in out if m == "loraplex" or m.startswith("loraplex.")]


FILES = sorted(PKG.rglob("*.py"))


def test_the_contract_imports_nothing_of_loraplex():
    assert imports(PKG / "contract.py", module_level_only=False) == []


def test_lower_packages_do_not_import_engine_or_ingress_at_module_level():
    bad = []
    for f in FILES:
        mod = module_name(f)
        if part(mod) in LOWER:
            bad += [f"{mod} -> {m}" for m in imports(f, module_level_only=True)
                    if part(m) in ("engine", "ingress")]
    assert bad == []


# The top: what builds the app, the CLI, the config reference's generator, and the alert-rule and
# dashboard generators, which read a whole serve config.
ROOT_CONFIG_READERS = ("loraplex.app", "loraplex.cli", "loraplex.config_docs", "loraplex.observability")


def test_only_the_top_imports_the_root_config_at_run_time():
    bad = []
    for f in FILES:
        mod = module_name(f)
        top = any(mod == reader or mod.startswith(reader + ".") for reader in ROOT_CONFIG_READERS)
        if mod != "loraplex.config" and not top:
            bad += [mod for m in imports(f, module_level_only=False) if m == "loraplex.config"]
    assert bad == []


def test_config_names_are_imported_from_their_home():
    """A config model imported only to be imported from here again (`# noqa: F401`) hides where
    it lives: every importer names the config module that defines it."""
    bad = [f"{f.relative_to(PKG)}: {line.strip()}" for f in FILES for line in f.read_text().splitlines()
           if "noqa: F401" in line and re.search(r"^\s*from loraplex(\.\w+)*\.config import", line)]
    assert bad == []


def package(p: str) -> str:
    """The package a part is in: `engine` for `engine` and `engine.config`; a top-level module is its own."""
    return p if p.startswith("loraplex.") else p.split(".")[0]


def graph() -> dict[str, set[str]]:
    """part -> parts it imports; a top-level module (config.py, app.py, ...) is a part of its own.
    Imports between a package's config.py and its other modules are left to the file-level test
    (routing's config validates the policy it names; the router reads the config)."""
    edges: dict[str, set[str]] = {}
    for f in FILES:
        mod = module_name(f)
        src = part(mod) if part(mod) != "loraplex" else mod
        for m in imports(f, module_level_only=False):
            dst = part(m) if part(m) != "loraplex" else m
            if package(dst) != package(src) and m != "loraplex":
                edges.setdefault(src, set()).add(dst)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one part (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_between_the_packages_parts():
    assert cycles(graph()) == []


def file_graph() -> dict[str, set[str]]:
    """module -> the loraplex modules it imports anywhere: at module level, inside functions and
    under `if TYPE_CHECKING:`."""
    edges: dict[str, set[str]] = {}
    for f in FILES:
        mod = module_name(f)
        edges[mod] = {m for m in imports(f, module_level_only=False, type_checking=True) if m != mod}
    return edges


def test_no_import_cycle_between_files():
    assert cycles(file_graph()) == []


def test_the_checks_catch_what_they_guard():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert part("loraplex.engine.deployment") == "engine" and part("loraplex.config") == "loraplex"
    assert part("loraplex.engine.config") == "engine.config"
    assert cycles({"a": {"a", "b"}, "b": set()}) == []  # a module's name in its own imports is no cycle


def test_file_cycles_count_lazy_and_type_checking_imports(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from loraplex.a import A\n"
                   "def f():\n    from loraplex.b import B\n")
    assert imports(mod, module_level_only=False) == ["loraplex.b"]
    assert imports(mod, module_level_only=False, type_checking=True) == ["loraplex.a", "loraplex.b"]
