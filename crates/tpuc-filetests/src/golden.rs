//! Golden files: an output compared with the file that holds what it should be, byte for byte
//! (with `TPUC_BLESS` set, the file becomes the output).

use std::path::Path;

/// `actual` is the text at `expected_path`, byte for byte; the error shows the difference.
pub fn compare(expected_path: &Path, actual: &str) -> Result<(), String> {
    if std::env::var_os("TPUC_BLESS").is_some() {
        return std::fs::write(expected_path, actual)
            .map_err(|e| format!("{}: {e}", expected_path.display()));
    }
    let expected = std::fs::read_to_string(expected_path).map_err(|e| {
        format!(
            "{}: {e} (run with TPUC_BLESS=1 to create it)",
            expected_path.display()
        )
    })?;
    if actual != expected {
        let diff = similar::TextDiff::from_lines(expected.as_str(), actual)
            .unified_diff()
            .header("expected", "actual")
            .to_string();
        return Err(format!(
            "{} differs from the output:\n{diff}\n(TPUC_BLESS=1 re-blesses)",
            expected_path.display()
        ));
    }
    Ok(())
}
