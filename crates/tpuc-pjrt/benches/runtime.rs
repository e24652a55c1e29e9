//! Runtime overhead and transfer throughput on the XLA CPU plugin.
//!
//! - `execute/*`: one execution of a small module (two 2x3 f32 inputs), outputs freed, through
//!   tpuc-pjrt and through the plugin's C API called directly with prepared arguments (the
//!   baseline). The difference is the wrapper's overhead.
//! - `host_to_device/*`: copying host data into a new buffer, with the copy semantics, with
//!   zero-copy from 64-byte aligned memory, and with zero-copy asked for memory that is not
//!   64-byte aligned (the plugin then copies).
//! - `device_to_host/*`: copying a buffer back.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pjrt_sys::*;
use std::sync::Arc;
use tpuc_pjrt::*;

const ADD: &str = r#"
module {
  func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.add %a, %b : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}"#;

fn client() -> Client {
    let path = discover::resolve(Some("cpu")).expect("the CPU plugin is installed");
    let plugin = Plugin::load(&path).expect("plugin");
    let options = ClientOptions {
        cpu_device_count: Some(1),
        ..Default::default()
    };
    Client::new(&plugin, &options).expect("client")
}

/// One execution through the C API: the arguments prepared once, outputs and events freed.
fn execute_direct(
    functions: &Functions,
    exe: *mut PJRT_LoadedExecutable,
    args: &[*mut PJRT_Buffer],
) {
    let arg_list = [args.as_ptr()];
    let mut outputs = [std::ptr::null_mut::<PJRT_Buffer>()];
    let output_list = [outputs.as_mut_ptr()];
    let mut events = [std::ptr::null_mut::<PJRT_Event>()];
    let mut options = PJRT_ExecuteOptions::new();
    let mut call = PJRT_LoadedExecutable_Execute_Args::new();
    call.executable = exe;
    call.options = &mut options;
    call.argument_lists = arg_list.as_ptr();
    call.num_devices = 1;
    call.num_args = args.len();
    call.output_lists = output_list.as_ptr();
    call.device_complete_events = events.as_mut_ptr();
    // SAFETY: live executable and buffers; every returned object is freed below.
    unsafe {
        assert!((functions.PJRT_LoadedExecutable_Execute)(&mut call).is_null());
        let mut wait = PJRT_Event_Await_Args::new();
        wait.event = events[0];
        assert!((functions.PJRT_Event_Await)(&mut wait).is_null());
        let mut destroy = PJRT_Event_Destroy_Args::new();
        destroy.event = events[0];
        (functions.PJRT_Event_Destroy)(&mut destroy);
        let mut free = PJRT_Buffer_Destroy_Args::new();
        free.buffer = outputs[0];
        (functions.PJRT_Buffer_Destroy)(&mut free);
    }
}

fn execute(c: &mut Criterion) {
    let client = client();
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .expect("compile");
    let device = &exe.devices()[0];
    let x = HostTensor::from_slice(DType::F32, &[2, 3], &[1.0f32; 6]).unwrap();
    let a = client.buffer_from_host(&x, device).unwrap();
    let b = client.buffer_from_host(&x, device).unwrap();
    let mut group = c.benchmark_group("execute");
    group.bench_function("tpuc_pjrt", |bench| {
        bench.iter(|| exe.execute_on_one_device(&[&a, &b]).unwrap())
    });
    let functions = *client.plugin().functions();
    let raw_args = [a.raw(), b.raw()];
    group.bench_function("direct_c_api", |bench| {
        bench.iter(|| execute_direct(&functions, exe.raw(), &raw_args))
    });
    group.finish();
}

/// Host memory deliberately 16 bytes past a 64-byte boundary.
struct Unaligned {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl Unaligned {
    fn new(len: usize) -> Self {
        let storage = vec![0u8; len + 128];
        let to_boundary = (64 - storage.as_ptr() as usize % 64) % 64;
        Unaligned {
            storage,
            offset: to_boundary + 16,
            len,
        }
    }
}

impl HostBytes for Unaligned {
    fn bytes(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }
}

fn transfers(c: &mut Criterion) {
    let client = client();
    let device = client.addressable_devices().unwrap().remove(0);
    for bytes in [4usize << 10, 4 << 20] {
        let elements = (bytes / 4) as i64;
        let tensor = Arc::new(HostTensor::zeros(DType::F32, &[elements]).unwrap());
        let unaligned: Arc<dyn HostBytes> = Arc::new(Unaligned::new(bytes));

        let mut h2d = c.benchmark_group("host_to_device");
        h2d.throughput(Throughput::Bytes(bytes as u64));
        h2d.bench_with_input(BenchmarkId::new("copy", bytes), &tensor, |bench, t| {
            bench.iter(|| client.buffer_from_host(t, &device).unwrap())
        });
        h2d.bench_with_input(
            BenchmarkId::new("zero_copy_aligned", bytes),
            &tensor,
            |bench, t| {
                bench.iter(|| {
                    let data: Arc<dyn HostBytes> = t.clone();
                    client
                        .buffer_sharing(DType::F32, &[elements], data, &device)
                        .unwrap()
                })
            },
        );
        h2d.bench_with_input(
            BenchmarkId::new("zero_copy_unaligned", bytes),
            &unaligned,
            |bench, data| {
                bench.iter(|| {
                    client
                        .buffer_sharing(DType::F32, &[elements], data.clone(), &device)
                        .unwrap()
                })
            },
        );
        h2d.finish();

        let buffer = client.buffer_from_host(&tensor, &device).unwrap();
        let mut out = vec![0u8; bytes];
        let mut d2h = c.benchmark_group("device_to_host");
        d2h.throughput(Throughput::Bytes(bytes as u64));
        d2h.bench_function(BenchmarkId::new("copy", bytes), |bench| {
            bench.iter(|| buffer.copy_to_host(&mut out).unwrap())
        });
        d2h.finish();
    }
}

criterion_group!(benches, execute, transfers);
criterion_main!(benches);
