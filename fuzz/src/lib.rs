//! What the fuzz targets share.
use std::path::{Path, PathBuf};

/// The input written as a file for a reader that opens files (it maps them); a RAM-backed
/// directory keeps that fast. One file per process, rewritten for each input.
pub fn input_file(data: &[u8], extension: &str) -> PathBuf {
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("tpuc-fuzz-{}.{extension}", std::process::id()));
    std::fs::write(&path, data).expect("writing the fuzz input");
    path
}
