//! The program JSON the torch.compile backend sends (torch.export's serialized graph).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tpuc_fx::program_from_json(std::path::Path::new("fuzz.json"), data);
});
