"""The `tpuc` command of the Python package: the `tpuc` binary's command, run by tpuc's extension
(one install gives the compile backend and the CLI). The extension is loaded on its own, without
importing the `tpuc` package (which imports torch for the device: a second, for a command that
needs none of it)."""
import glob
import importlib.util
import os
import signal
import sys


def _extension():
    package = importlib.util.find_spec("tpuc")
    if package is None or not package.submodule_search_locations:
        sys.exit("tpuc: the tpuc package is not installed beside this command")
    found = [path for where in package.submodule_search_locations
             for path in glob.glob(os.path.join(where, "_tpuc.*so"))]
    if not found:
        sys.exit(f"tpuc: no compiled extension (_tpuc.*.so) in {list(package.submodule_search_locations)}")
    spec = importlib.util.spec_from_file_location("tpuc._tpuc", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    extension = _extension()
    # Ctrl-C stops the command as it stops the binary (the extension does not return to Python
    # while it works, so Python's KeyboardInterrupt would wait for it).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(extension.cli_main(["tpuc", *sys.argv[1:]], [p for p in sys.path if p]))
