//! Resident memory over many executions. A test binary of its own: the measurement is of the
//! whole process, so no other test may run beside it.
mod common;

use common::*;
use std::sync::Arc;
use tpuc_pjrt::*;

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn ten_thousand_executions_keep_resident_memory_flat() {
    let client = client(1);
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    let device = &exe.devices()[0];
    let input = Arc::new(f32s(&[2, 3], &[1.0; 6]));
    let run = || {
        let a = client
            .buffer_sharing(DType::F32, &[2, 3], input.clone(), device)
            .unwrap();
        let b = client.buffer_from_host(&input, device).unwrap();
        let out = exe.execute_on_one_device(&[&a, &b]).unwrap();
        assert_eq!(
            out[0].to_host().unwrap().to_vec::<f32>().unwrap(),
            vec![2.0; 6]
        );
    };
    for _ in 0..1000 {
        run();
    }
    let before = resident_bytes();
    for _ in 0..10_000 {
        run();
    }
    let growth = resident_bytes().saturating_sub(before);
    // A leak of one 24-byte buffer per run would already be 240 KB; allow allocator noise.
    assert!(
        growth < 2 << 20,
        "resident memory grew by {growth} bytes over 10,000 runs"
    );
}
