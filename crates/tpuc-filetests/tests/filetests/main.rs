//! Every case under `filetests/` (an FX graph in text and CHECK lines; see
//! `tpuc_filetests::case`), and the golden modules of `testdata/lowering` (`emitted`). The one
//! test binary of this crate, and one of the few that link MLIR.

mod emitted;

use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Failed, Trial};
use tpuc_filetests::case::parse_case;
use tpuc_filetests::run_case;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests")
}

/// The case files under `dir`, at any depth, in order.
fn case_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(case_files(&path));
        } else if path.extension().is_some_and(|e| e == "fxt") {
            files.push(path);
        }
    }
    files
}

fn emit_text(module: &tpuc_hlo::Module) -> Result<String, String> {
    tpuc_emit::emit_text(module).map_err(|e| e.to_string())
}

fn run_file(path: &Path) -> Result<(), Failed> {
    let shown = path
        .strip_prefix(cases_dir())
        .unwrap_or(path)
        .display()
        .to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    let case = parse_case(&text).map_err(|e| format!("{shown}: {e}"))?;
    run_case(&case, &emit_text).map_err(|e| format!("{shown}: {e}").into())
}

fn main() {
    let args = Arguments::from_args();
    let root = cases_dir();
    let mut trials: Vec<Trial> = case_files(&root)
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(&root).unwrap().with_extension("");
            let name = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("::");
            Trial::test(name, move || run_file(&path))
        })
        .collect();
    trials.extend(emitted::trials());
    libtest_mimic::run(&args, trials).exit();
}
