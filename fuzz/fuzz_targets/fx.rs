//! tpuc's `.fx` reader (its protobuf interchange), as `tpuc compile` reads any program file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tpuc_fx::read_program(&tpuc_fuzz::input_file(data, "fx"));
});
