#!/usr/bin/env python3
"""Records the C layout of every PJRT struct that crates/pjrt-sys defines.

usage: tools/pjrt_layout.py PATH/TO/pjrt_c_api.h

The header is the PJRT C API at the version the bindings target (0.106). The script asks the
layout test for the structs and field names the Rust side defines, has a C compiler compute
their sizes and offsets from the header, and writes crates/pjrt-sys/tests/layout_0_106.txt.
The layout test then compares the Rust definitions with those numbers.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "pjrt-sys", "tests", "layout_0_106.txt")


def rust_structs(dump):
    env = dict(os.environ, PJRT_LAYOUT_DUMP=dump)
    subprocess.run(["cargo", "test", "-q", "-p", "pjrt-sys", "--test", "layout", "layouts_match"],
                   cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    structs = []
    for line in open(dump):
        name, _size, *fields = line.split()
        structs.append((name, [f.split("=")[0] for f in fields]))
    return structs


def main(header):
    with tempfile.TemporaryDirectory() as tmp:
        structs = rust_structs(os.path.join(tmp, "rust.txt"))
        lines = ['#include <stddef.h>', '#include <stdio.h>', f'#include "{os.path.abspath(header)}"',
                 "int main(void) {"]
        for name, fields in structs:
            lines.append(f'  printf("{name} size=%zu", sizeof({name}));')
            for field in fields:
                lines.append(f'  printf(" {field}=%zu", offsetof({name}, {field}));')
            lines.append('  printf("\\n");')
        lines.append("  return 0;\n}")
        source = os.path.join(tmp, "layout.c")
        with open(source, "w") as f:
            f.write("\n".join(lines))
        binary = os.path.join(tmp, "layout")
        subprocess.run(["gcc", "-std=c11", "-o", binary, source], check=True)
        table = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    with open(OUT, "w") as f:
        f.write(table)
    print(f"wrote {len(structs)} struct layouts to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
