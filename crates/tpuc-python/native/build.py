"""Builds the tpuc device's native layer (`tpuc/_tpuc_native*.so`) with PyTorch's own extension
tooling, against the installed torch (its ABI is that torch version's). Run by tools/setup.sh;
`python native/build.py OUT_DIR`."""
import os
import sys
from pathlib import Path

# torch's autoload of device backends would import tpuc, whose device needs what this builds.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402
from setuptools import Distribution  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

HERE = Path(__file__).resolve().parent
SOURCES = ["runtime.cpp", "storage.cpp", "ops.cpp", "fusion.cpp", "kernels.cpp", "value_sized.cpp", "hooks.cpp",
           "generator.cpp", "distributed.cpp", "module.cpp"]


def main(out_dir: str) -> None:
    # ninja (a package of the venv) compiles the sources side by side.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    extension = CppExtension("tpuc._tpuc_native", [str(HERE / s) for s in SOURCES],
                             extra_compile_args=["-O2", "-std=c++20", "-Wno-unused-parameter",
                                                 # the torch it is built against (its ABI), checked at import
                                                 f'-DTPUC_TORCH_VERSION="{torch.__version__}"'])
    distribution = Distribution({"name": "tpuc-native", "ext_modules": [extension],
                                 "cmdclass": {"build_ext": BuildExtension.with_options(use_ninja=True)}})
    command = distribution.get_command_obj("build_ext")
    command.build_lib = out_dir
    command.build_temp = str(HERE.parent.parent.parent / "target" / "native")
    distribution.run_command("build_ext")


if __name__ == "__main__":
    main(sys.argv[1])
