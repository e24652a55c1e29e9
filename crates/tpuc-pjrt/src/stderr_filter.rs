//! Running a plugin call with known false alarms removed from what it logs: the process's
//! standard error (file descriptor 2, where the plugin's logging writes) goes to a temporary
//! file for the call, and afterwards every line of it but the dropped ones is written to the
//! real standard error. Output of other threads in that window is kept too, only delayed.
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Mutex;

/// One redirection at a time: a second would capture the first's temporary file.
static REDIRECTING: Mutex<()> = Mutex::new(());

/// Runs `body`, then passes on what was written to standard error meanwhile, without the lines
/// for which `drop_line` is true. Where standard error cannot be redirected, runs `body` as it is.
pub(crate) fn filtered<T>(drop_line: fn(&str) -> bool, body: impl FnOnce() -> T) -> T {
    let _one_at_a_time = REDIRECTING.lock().unwrap_or_else(|e| e.into_inner());
    // Restored, and the kept lines passed on, when dropped (after `body`, even if it panics).
    let _redirected = Redirected::start(drop_line);
    body()
}

struct Redirected {
    capture: std::fs::File,
    /// A duplicate of the original standard error.
    saved: libc::c_int,
    drop_line: fn(&str) -> bool,
}

impl Redirected {
    fn start(drop_line: fn(&str) -> bool) -> Option<Redirected> {
        use std::os::fd::AsRawFd;
        let capture = tempfile::tempfile().ok()?;
        let _ = std::io::stderr().flush();
        // SAFETY: plain descriptor calls; `saved` is closed exactly once, in `drop`.
        unsafe {
            let saved = libc::dup(2);
            if saved < 0 {
                return None;
            }
            if libc::dup2(capture.as_raw_fd(), 2) < 0 {
                libc::close(saved);
                return None;
            }
            Some(Redirected {
                capture,
                saved,
                drop_line,
            })
        }
    }
}

impl Drop for Redirected {
    fn drop(&mut self) {
        let _ = std::io::stderr().flush();
        // SAFETY: `saved` is the original standard error, duplicated in `start`.
        unsafe {
            libc::dup2(self.saved, 2);
            libc::close(self.saved);
        }
        let mut written = Vec::new();
        if self.capture.seek(SeekFrom::Start(0)).is_err()
            || self.capture.read_to_end(&mut written).is_err()
        {
            return;
        }
        let text = String::from_utf8_lossy(&written);
        let kept: String = text
            .split_inclusive('\n')
            .filter(|line| !(self.drop_line)(line))
            .collect();
        let _ = std::io::stderr().write_all(kept.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_lines_go_and_the_rest_stays() {
        // The test harness captures Rust's eprintln!, not descriptor 2, so the check reads
        // descriptor 2 through a second redirection around the filtered one.
        let outer = tempfile::tempfile().unwrap();
        let mut outer_copy = outer.try_clone().unwrap();
        let result = {
            use std::os::fd::AsRawFd;
            let saved = unsafe { libc::dup(2) };
            unsafe { libc::dup2(outer.as_raw_fd(), 2) };
            let result = filtered(
                |line| line.contains("false alarm"),
                || {
                    let mut fd2 = std::io::stderr();
                    fd2.write_all(b"kept 1\na false alarm\nkept 2\nno newline at the end")
                        .unwrap();
                    42
                },
            );
            unsafe {
                libc::dup2(saved, 2);
                libc::close(saved);
            }
            result
        };
        assert_eq!(result, 42);
        let mut text = String::new();
        outer_copy.seek(SeekFrom::Start(0)).unwrap();
        outer_copy.read_to_string(&mut text).unwrap();
        assert_eq!(text, "kept 1\nkept 2\nno newline at the end");
    }
}
