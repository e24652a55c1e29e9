//! The `.npy` and `.npz` readers (`tpuc run`'s inputs and expected outputs).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;

fuzz_target!(|data: &[u8]| {
    if data.starts_with(b"PK") {
        let _ = tpuc_npy::read_npz_from(Cursor::new(data));
    } else {
        let _ = tpuc_npy::read_npy_from(data);
    }
});
