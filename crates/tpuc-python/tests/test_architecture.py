"""The dependency rules docs/ARCHITECTURE.md states for the Python extension, read from the code:
tpuc-python runs programs through the driver and uses tpuc-cli only for the `tpuc` command."""
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXTENSION = ROOT / "crates" / "tpuc-python"


def test_the_extension_uses_the_cli_crate_only_for_the_command():
    manifest = tomllib.loads((EXTENSION / "Cargo.toml").read_text())
    assert "tpuc-cli" in manifest["dependencies"], "the wheel's `tpuc` command is the CLI's main"
    uses = {}
    for path in sorted((EXTENSION / "src").rglob("*.rs")):
        for line, text in enumerate(path.read_text().splitlines(), 1):
            for found in re.findall(r"tpuc_cli::[A-Za-z_:]+", text):
                uses.setdefault(found, []).append(f"{path.relative_to(ROOT)}:{line}")
    assert set(uses) == {"tpuc_cli::cli::main"}, uses


def test_the_cli_crate_keeps_no_runner():
    """Binding a program's arguments is the driver's (`tpuc_driver::Loaded`)."""
    sources = "\n".join(p.read_text() for p in (ROOT / "crates" / "tpuc-cli" / "src").rglob("*.rs"))
    for name in ("upload_sharded", "execute_on_one_device", "ArgRole::"):
        assert name not in sources, f"tpuc-cli binds arguments itself ({name})"


def crate_rules() -> dict:
    """Which workspace crates each crate may depend on, as docs/ARCHITECTURE.md's `crate-rules`
    block states it."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"```crate-rules\n(.*?)```", text, re.DOTALL)
    assert block, "docs/ARCHITECTURE.md has no crate-rules block"
    rules = {}
    for line in block.group(1).splitlines():
        name, _, allowed = line.partition(":")
        rules[name.strip()] = set(allowed.split())
    return rules


def crate_dependencies() -> dict:
    found = {}
    for manifest in sorted((ROOT / "crates").glob("*/Cargo.toml")):
        data = tomllib.loads(manifest.read_text())
        found[data["package"]["name"]] = set(data.get("dependencies", {}))
    return found


def test_crates_depend_only_as_the_architecture_says():
    found, rules = crate_dependencies(), crate_rules()
    assert set(found) == set(rules), "a new crate: give it its rule in docs/ARCHITECTURE.md's crate-rules block"
    wrong = {name: sorted(deps & set(rules) - rules[name]) for name, deps in found.items()}
    assert not any(wrong.values()), wrong


def test_only_the_emitter_links_mlir():
    linking = sorted(name for name, deps in crate_dependencies().items() if "melior" in deps or "mlir-sys" in deps)
    assert linking == ["tpuc-emit"], linking


def test_no_crate_but_tpuc_dtype_lists_element_types():
    """Mapping every element type onto a format (an exhaustive `match`) is each format's own
    business; a list of the types (an array of them) belongs to tpuc-dtype alone."""
    listing = re.compile(r"\[\s*(?:DType::\w+\s*,\s*){5,}DType::\w+\s*,?\s*\]")
    found = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "crates").rglob("*.rs"))
        if "tpuc-dtype" not in path.parts and listing.search(path.read_text())
    ]
    assert not found, f"lists of element types outside tpuc-dtype: {found}"


def documented_invariants() -> list:
    """The paragraphs of docs/ARCHITECTURE.md that state an architecture invariant."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    return [p for p in re.split(r"\n\s*\n", text) if p.startswith("Architecture invariant:")]


def defined_tests() -> set:
    """The names of the test functions of the workspace, Rust and Python."""
    names = set()
    for path in (ROOT / "crates").rglob("*.rs"):
        names.update(re.findall(r"\bfn (\w+)\s*\(", path.read_text()))
    for path in (ROOT / "crates" / "tpuc-python").rglob("test_*.py"):
        names.update(re.findall(r"^def (test_\w+)\s*\(", path.read_text(), re.MULTILINE))
    return names


def test_every_documented_invariant_names_a_test_that_exists():
    """Each invariant says which tests check it ("checked by `name`, `name`"), and they exist:
    an invariant no test checks is a wish, and a renamed test must not leave the document behind."""
    invariants = documented_invariants()
    assert len(invariants) >= 10, "docs/ARCHITECTURE.md lost its invariants"
    tests = defined_tests()
    for paragraph in invariants:
        flat = " ".join(paragraph.split())
        named = re.search(r"[Cc]hecked by ((?:`\w+`(?:,\s*|\s+and\s+)?)+)", flat)
        first = flat[:90]
        assert named, f"the invariant names no test that checks it: {first}..."
        missing = [n for n in re.findall(r"`(\w+)`", named.group(1)) if n not in tests]
        assert not missing, f"{first}...: no such tests: {missing}"
