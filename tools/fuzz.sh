#!/usr/bin/env bash
# Fuzz campaign over tpuc's readers (cargo-fuzz, nightly): the .pt2 reader, the .fx reader, the
# program JSON the backend sends, the symbolic-size expression parser and the .npy/.npz reader,
# each seeded from testdata/ and run for SECONDS (default 1200). Any allocation over 256 MB, a
# resident size over 2 GB or an input taking over 10 s is a failure, like a crash. Prints each
# target's executions, coverage and failures; failing inputs are left in fuzz/artifacts/TARGET/:
# minimise one (`cargo +nightly fuzz tmin TARGET FILE`), add it to testdata/fuzz/TARGET/ and the
# regression tests (crates/tpuc-fx/tests/fuzz_regressions.rs for archives, crates/tpuc-npy/tests/
# fuzz_regressions.rs for arrays) read it on the stable toolchain.
# Each run appends a line to fuzz/artifacts/campaigns.tsv (date, target, limits, executions,
# coverage, failures), so that executions over several runs can be added up.
# Usage: tools/fuzz.sh [--max-len BYTES] [--runs N] [SECONDS] [TARGET ...]
#   --max-len  longest input tried (libFuzzer's default is the longest seed; smaller inputs run
#              many times faster: a 16 KB limit runs the .pt2 reader ~9x as often)
#   --runs     stop a target after N executions (before SECONDS if it gets there first)
set -euo pipefail
cd "$(dirname "$0")/.."
limits=()
while [ $# -gt 0 ]; do
    case $1 in
        --max-len) limits+=(-max_len="$2"); shift 2 ;;
        --runs) limits+=(-runs="$2"); shift 2 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "tools/fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
seconds=${1:-1200}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pt2 fx program_json sym_expr npy)

tools/setup.sh
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz
rustup toolchain list | grep -q '^nightly' || { echo "tools/fuzz.sh needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1; }
cargo build -q --release -p tpuc-cli

# Seeds: the test data's archives and arrays, the .fx form of the archives, their programs' JSON,
# and torch.export's size expressions.
corpus=fuzz/corpus
mkdir -p "$corpus"/{pt2,fx,program_json,sym_expr,npy}
for archive in testdata/lowering/*.pt2; do
    name=$(basename "$archive" .pt2)
    cp "$archive" "$corpus/pt2/"
    [ -f "$corpus/fx/$name.fx" ] || target/release/tpuc convert "$archive" -o "$corpus/fx/$name.fx" >/dev/null
done
cp testdata/lowering/*.npz "$corpus/npy/"
.venv/bin/python - "$corpus" <<'PY'
import glob, io, os, sys, zipfile
corpus = sys.argv[1]
for path in glob.glob("testdata/lowering/*.pt2"):
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith("models/model.json"):
                with open(os.path.join(corpus, "program_json", os.path.basename(path) + ".json"), "wb") as f:
                    f.write(z.read(name))
for path in glob.glob("testdata/lowering/*.npz"):
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            with open(os.path.join(corpus, "npy", os.path.basename(path) + "." + name), "wb") as f:
                f.write(z.read(name))
s = "Symbol('s27', positive=True, integer=True)"
t = "Symbol('s17', positive=True, integer=True)"
for i, text in enumerate([s, "Integer(8)", f"Mul(Integer(8), {s})", f"Add(Mul(Integer(16), {s}), Integer(32))",
                          f"FloorDiv({s}, Integer(2))", f"Max(Integer(1), {s})", f"Mul({t}, {s})",
                          f"Mod({s}, Integer(3))", f"Min({s}, Add({t}, Integer(-1)))", "Sqrt(Integer(4))"]):
    with open(os.path.join(corpus, "sym_expr", f"seed{i}"), "w") as f:
        f.write(text)
PY

summary=()
for target in "${targets[@]}"; do
    log=fuzz/artifacts/$target.log
    mkdir -p "fuzz/artifacts/$target"
    echo "[fuzz] $target for ${seconds}s" >&2
    status=0
    cargo +nightly fuzz run -O "$target" "$corpus/$target" -- -max_total_time="$seconds" \
        -rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$target/" ${limits[@]+"${limits[@]}"} >"$log" 2>&1 || status=$?
    executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    coverage=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
    failures=$(find "fuzz/artifacts/$target" -type f | wc -l)
    printf '%s\t%s\t%ss %s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$target" "$seconds" "${limits[*]:-}" \
        "${executions:-0}" "${coverage:-}" "$failures" >>fuzz/artifacts/campaigns.tsv
    summary+=("$target: ${executions:-?} executions, ${coverage:-no coverage line}, $failures failing input(s), exit $status")
done
printf '%s\n' "${summary[@]}"
