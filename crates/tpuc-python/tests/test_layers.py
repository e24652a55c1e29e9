"""The Python package's layers (docs/ARCHITECTURE.md), read from its imports: each module imports
only modules of its own layer or below, the imports form no cycle (imports inside functions
count), and no module uses another's private names."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "python" / "tpuc"

# Bottom to top. The runtime knows buffers and compiled graphs, not the eager device (which gives
# it hooks); graph preparation knows FX graphs; the compiler turns them into runtime calls; the
# eager device and the compile backend sit on it side by side.
LAYERS = [
    {"_tpuc", "_tpuc_native"},
    {"runtime", "tolerance"},
    {"graph", "options", "decompositions", "custom_ops", "kernels", "sharding"},
    {"compiler"},
    {"accelerator", "autocast", "process_group", "op_tracing", "flex_attention", "default_compiler"},
    {"device", "planner", "plan_store", "fusion", "checks"},
    {"backend", "diagnosis", "compare", "ranks", "exported"},
    {"__init__"},
]
LAYER = {module: i for i, layer in enumerate(LAYERS) for module in layer}


def imports(path: pathlib.Path) -> tuple[set, list]:
    """The package modules `path` imports (anywhere in it), and the private names it takes from
    them (`from .x import _y`, `x._y` on an imported module)."""
    tree = ast.parse(path.read_text())
    modules, aliases, private = set(), {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:
                for name in node.names:
                    modules.add(name.name)
                    aliases[name.asname or name.name] = name.name
            else:
                module = node.module.split(".")[0]
                modules.add(module)
                if module != "_tpuc":
                    private += [f"{module}.{n.name}" for n in node.names if n.name.startswith("_")]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                and not node.attr.startswith("__") and aliases.get(node.value.id, "_tpuc") != "_tpuc"):
            private.append(f"{aliases[node.value.id]}.{node.attr}")
    return modules, private


def graph() -> dict:
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        found[path.stem] = imports(path)
    found["_tpuc"] = (set(), [])
    found["_tpuc_native"] = (set(), [])
    return found


def test_every_module_has_a_layer():
    assert set(graph()) == set(LAYER), "add the module to LAYERS (and to docs/ARCHITECTURE.md)"


def test_modules_import_only_their_layer_and_below():
    wrong = [f"{m} (layer {LAYER[m]}) imports {i} (layer {LAYER[i]})"
             for m, (imported, _) in graph().items() for i in imported if LAYER[i] > LAYER[m]]
    assert not wrong, wrong


def test_the_imports_form_no_cycle():
    edges = {m: imported for m, (imported, _) in graph().items()}
    state: dict = {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        state[module] = "open"
        for other in sorted(edges[module]):
            visit(other, path + [module])
        state[module] = "done"

    for module in sorted(edges):
        visit(module, [])


def test_no_module_uses_another_modules_private_names():
    used = {m: private for m, (_, private) in graph().items() if private}
    assert not used, used
