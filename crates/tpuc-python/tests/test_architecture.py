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
