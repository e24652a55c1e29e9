//! Inputs the fuzzer found (tools/fuzz.sh, target `npy`), each read as `tpuc run` reads its
//! arrays: every one is an error naming what is wrong, at once, not a panic, a hang or a huge
//! allocation.
use std::path::Path;

#[test]
fn fuzzer_found_inputs_are_clear_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/npy");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/npy") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let result = if data.starts_with(b"PK") {
            tpuc_npy::read_npz_from(std::io::Cursor::new(&data)).map(|_| ())
        } else {
            tpuc_npy::read_npy_from(&data[..]).map(|_| ())
        };
        let error = result.expect_err(&format!("{} was read as an array", path.display()));
        assert!(!format!("{error:#}").is_empty());
        read += 1;
    }
    assert!(read > 0, "no inputs in {}", dir.display());
}

#[test]
fn a_header_claiming_a_huge_shape_allocates_nothing_for_it() {
    // 2^40 float32 elements announced, 8 bytes given: an error, not a 4 TiB allocation.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }";
    let mut data = b"\x93NUMPY\x01\x00".to_vec();
    let padded = format!("{header:<117}\n");
    data.extend_from_slice(&(padded.len() as u16).to_le_bytes());
    data.extend_from_slice(padded.as_bytes());
    data.extend_from_slice(&[0u8; 8]);
    let error = tpuc_npy::read_npy_from(&data[..]).unwrap_err();
    assert!(
        format!("{error:#}").contains("shorter than its shape"),
        "{error:#}"
    );
}

#[test]
fn a_deeply_nested_header_is_refused_before_parsing() {
    let header = format!("{{'shape': {}}}", "[".repeat(64));
    let mut data = b"\x93NUMPY\x01\x00".to_vec();
    data.extend_from_slice(&(header.len() as u16).to_le_bytes());
    data.extend_from_slice(header.as_bytes());
    let error = tpuc_npy::read_npy_from(&data[..]).unwrap_err();
    assert!(
        format!("{error:#}").contains("nests brackets 65 deep"),
        "{error:#}"
    );
}
