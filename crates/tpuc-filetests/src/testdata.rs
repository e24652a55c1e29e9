//! What the test binaries of several crates share: where the test data is, the golden
//! archives, and a cache of compiled executables of the tests' own.

use std::path::{Path, PathBuf};

/// `testdata/lowering` of the repository.
pub fn lowering_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/lowering")
}

/// The golden archives (`testdata/lowering/<case>.pt2`), in order.
pub fn golden_archives() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(lowering_dir())
        .expect("testdata/lowering exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pt2"))
        .collect();
    cases.sort();
    cases
}

/// Points `TPUC_CACHE_DIR` at a new temporary directory (unless the caller set one), so that
/// tests never read or fill the user's cache; the directory goes when the guard does. Call it
/// first in a test binary's `main`, before any thread starts.
pub fn private_cache() -> tempfile::TempDir {
    let cache = tempfile::tempdir().expect("a temporary directory");
    if std::env::var_os("TPUC_CACHE_DIR").is_none() {
        // SAFETY: called before any other thread exists (see above).
        unsafe { std::env::set_var("TPUC_CACHE_DIR", cache.path()) };
    }
    cache
}
