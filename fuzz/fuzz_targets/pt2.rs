//! The `.pt2` reader (a zip of torch.export's JSON and weights) on arbitrary bytes: an error or
//! a program, never a panic or a hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tpuc_fx::read_pt2(&tpuc_fuzz::input_file(data, "pt2"));
});
