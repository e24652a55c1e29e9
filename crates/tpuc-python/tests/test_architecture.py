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


# Which workspace crates each crate may depend on (docs/ARCHITECTURE.md's code map): the IR and
# the lowering know no MLIR and no PJRT, the runtime knows no IR, the driver is the only crate
# joining them, and the callers sit on the driver.
CRATE_RULES = {
    "tpuc-dtype": set(),
    "pjrt-sys": set(),
    "tpuc-fx": {"tpuc-dtype"},
    "tpuc-hlo": {"tpuc-dtype", "tpuc-fx"},
    "tpuc-emit": {"tpuc-hlo"},
    "tpuc-pjrt": {"pjrt-sys", "tpuc-dtype"},
    "tpuc-npy": {"tpuc-dtype", "tpuc-pjrt"},
    "tpuc-driver": {"tpuc-dtype", "tpuc-fx", "tpuc-hlo", "tpuc-emit", "tpuc-pjrt"},
    "tpuc-cli": {"tpuc-dtype", "tpuc-fx", "tpuc-hlo", "tpuc-emit", "tpuc-pjrt", "tpuc-driver", "tpuc-npy"},
    "tpuc-python": {"tpuc-fx", "tpuc-hlo", "tpuc-pjrt", "tpuc-driver", "tpuc-cli"},
}


def crate_dependencies() -> dict:
    found = {}
    for manifest in sorted((ROOT / "crates").glob("*/Cargo.toml")):
        data = tomllib.loads(manifest.read_text())
        found[data["package"]["name"]] = set(data.get("dependencies", {}))
    return found


def test_crates_depend_only_as_the_architecture_says():
    found = crate_dependencies()
    assert set(found) == set(CRATE_RULES), "a new crate: give it its rule here and in docs/ARCHITECTURE.md"
    wrong = {name: sorted(deps & set(CRATE_RULES) - CRATE_RULES[name]) for name, deps in found.items()}
    assert not any(wrong.values()), wrong


def test_only_the_emitter_links_mlir():
    linking = sorted(name for name, deps in crate_dependencies().items() if "melior" in deps or "mlir-sys" in deps)
    assert linking == ["tpuc-emit"], linking
