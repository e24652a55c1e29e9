//! Archives the fuzzer found (tools/fuzz.sh, target `pt2`), read as `tpuc compile` reads them:
//! each is a program or an error, never a panic, and no allocation beyond a small multiple of
//! the file's size (the test binary counts its allocations).
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, remembering the largest single allocation asked of it.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

#[test]
fn fuzzer_found_archives_read_without_huge_allocations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/pt2");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/pt2") {
        let path = entry.unwrap().path();
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        LARGEST.store(0, Ordering::Relaxed);
        if let Err(error) = tpuc_fx::read_pt2(&path) {
            assert!(!error.to_string().is_empty());
        }
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= 64 * size.max(1 << 16),
            "{} ({size} bytes) made an allocation of {largest} bytes",
            path.display()
        );
        read += 1;
    }
    assert!(read > 0, "no inputs in {}", dir.display());
}
