//! The runtime against the real XLA CPU plugin.
mod common;

use common::*;
use std::sync::Arc;
use tpuc_pjrt::*;

fn run_add(client: &Client, exe: &Executable, a: &[f32], b: &[f32]) -> Vec<f32> {
    let device = &exe.devices()[0];
    let a = client.buffer_from_host(&f32s(&[2, 3], a), device).unwrap();
    let b = client.buffer_from_host(&f32s(&[2, 3], b), device).unwrap();
    let out = exe.execute_on_one_device(&[&a, &b]).unwrap();
    assert_eq!(out.len(), 1);
    out[0].to_host().unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn plugin_reports_version_and_attributes() {
    let plugin = plugin();
    let (major, minor) = plugin.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 100, "API 0.{minor}");
    assert!(plugin.attribute("stablehlo_current_version").is_some());
    assert!(
        Arc::ptr_eq(&plugin, &self::plugin()),
        "a plugin is loaded once"
    );
}

#[test]
fn client_has_the_requested_devices_and_memories() {
    let client = client(3);
    assert_eq!(client.platform_name().unwrap(), "cpu");
    let devices = client.addressable_devices().unwrap();
    assert_eq!(devices.len(), 3);
    let ids: Vec<i32> = devices.iter().map(|d| d.id().unwrap()).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    assert!(devices[0].is_addressable().unwrap());
    assert!(!devices[0].kind().unwrap().is_empty());
    assert!(!devices[0].memories().unwrap().is_empty());
    assert!(!devices[0]
        .default_memory()
        .unwrap()
        .kind()
        .unwrap()
        .is_empty());
    assert!(!client.addressable_memories().unwrap().is_empty());
    // XLA's CPU plugin sets no limit on a device's memory: none is made up.
    assert_eq!(devices[0].memory_limit(), None);
}

#[test]
fn compiles_and_executes() {
    let client = client(1);
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    assert_eq!(exe.num_outputs(), 1);
    assert_eq!(exe.output_element_types().unwrap(), vec![DType::F32]);
    assert_eq!(exe.output_dims().unwrap(), vec![vec![2, 3]]);
    let out = run_add(
        &client,
        &exe,
        &[1., 2., 3., 4., 5., 6.],
        &[10., 20., 30., 40., 50., 60.],
    );
    assert_eq!(out, vec![11., 22., 33., 44., 55., 66.]);
}

#[test]
fn minimum_and_maximum_propagate_nan() {
    // XLA:CPU's fast min/max would return the number; the runtime turns it off, as torch
    // propagates NaN (elementwise and in reductions).
    const MIN_MAX: &str = r#"
module {
  func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<3xf32>) {
    %max = stablehlo.maximum %a, %b : tensor<2x3xf32>
    %min = stablehlo.minimum %b, %a : tensor<2x3xf32>
    %lowest = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %colmax = stablehlo.reduce(%a init: %lowest) applies stablehlo.maximum across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
    return %max, %min, %colmax : tensor<2x3xf32>, tensor<2x3xf32>, tensor<3xf32>
  }
}"#;
    let client = client(1);
    let exe = client
        .compile_mlir(MIN_MAX.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    let device = &exe.devices()[0];
    let nan = f32::NAN;
    let a = client
        .buffer_from_host(&f32s(&[2, 3], &[nan, 1., 2., 3., nan, 5.]), device)
        .unwrap();
    let b = client
        .buffer_from_host(&f32s(&[2, 3], &[0.; 6]), device)
        .unwrap();
    let out = exe.execute_on_one_device(&[&a, &b]).unwrap();
    let read = |i: usize| out[i].to_host().unwrap().to_vec::<f32>().unwrap();
    for (i, expected_nan) in [
        (0, vec![true, false, false, false, true, false]),
        (1, vec![true, false, false, false, true, false]),
        (2, vec![true, true, false]),
    ] {
        let got: Vec<bool> = read(i).iter().map(|v| v.is_nan()).collect();
        assert_eq!(got, expected_nan, "output {i}: {:?}", read(i));
    }
}

#[test]
fn launched_executions_chain_and_their_inputs_may_go_at_once() {
    let client = client(1);
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    let device = &exe.devices()[0];
    let mut total = client
        .buffer_from_host(&f32s(&[2, 3], &[0.; 6]), device)
        .unwrap();
    for _ in 0..50 {
        let host = Arc::new(f32s(&[2, 3], &[1.; 6]));
        let one = client
            .buffer_sharing(DType::F32, &[2, 3], host.clone(), device)
            .unwrap();
        let mut out = exe.launch_on_one_device(&[&total, &one]).unwrap();
        // Gone before the execution may have read it: the buffer keeps its host memory until
        // the plugin is done with it.
        drop(one);
        drop(host);
        total = out.remove(0);
    }
    client.synchronize().unwrap();
    assert_eq!(
        total.to_host().unwrap().to_vec::<f32>().unwrap(),
        vec![50.; 6]
    );
    assert!(exe.launch_on_one_device(&[&total]).is_err());
}

#[test]
fn aligned_host_memory_is_shared_not_copied() {
    let client = client(1);
    let device = &client.addressable_devices().unwrap()[0];
    let host = Arc::new(f32s(&[4, 16], &[1.5; 64]));
    let address = host.bytes().as_ptr() as usize;
    assert_eq!(address % 64, 0);
    let shared = client
        .buffer_sharing(DType::F32, &[4, 16], host.clone(), device)
        .unwrap();
    assert_eq!(
        shared.device_address().unwrap(),
        address,
        "zero-copy aliases the host memory"
    );
    let copied = client.buffer_from_host(&host, device).unwrap();
    assert_ne!(copied.device_address().unwrap(), address);
    assert_eq!(
        shared.to_host().unwrap().to_vec::<f32>().unwrap(),
        vec![1.5; 64]
    );
    drop(shared);
    assert_eq!(
        Arc::strong_count(&host),
        1,
        "the buffer released the host memory"
    );
}

#[test]
fn sharded_tensors_come_back_whole_from_their_parts() {
    let client = client(4);
    let devices = client.addressable_devices().unwrap();
    let dims = [4, 8, 2];
    let values: Vec<f32> = (0..64).map(|v| v as f32).collect();
    let host: Arc<dyn HostBytes> = Arc::new(f32s(&dims, &values));
    // A 2x2 mesh: rows over axis 0 (contiguous parts), the middle dimension over axis 1
    // (gathered and scattered row by row), both axes on one dimension, and axis 1 replicating.
    for dims_axes in [
        vec![vec![0], vec![1], vec![]],
        vec![vec![], vec![1, 0], vec![]],
        vec![vec![0], vec![], vec![]],
        vec![vec![], vec![], vec![]],
    ] {
        let layout = ShardLayout::new(vec![2, 2], dims_axes.clone()).unwrap();
        let parts = client
            .upload_sharded(DType::F32, &dims, host.clone(), &layout, &devices)
            .unwrap();
        let mut whole = f32s(&dims, &[0.0; 64]);
        let refs: Vec<&Buffer> = parts.iter().collect();
        download_sharded(&refs, &layout, DType::F32, &dims, whole.bytes_mut()).unwrap();
        assert_eq!(whole.to_vec::<f32>().unwrap(), values, "{dims_axes:?}");
    }
    // Destinations and part counts that do not fit are errors.
    let layout = ShardLayout::new(vec![2, 2], vec![vec![0], vec![], vec![]]).unwrap();
    let parts = client
        .upload_sharded(DType::F32, &dims, host, &layout, &devices)
        .unwrap();
    let refs: Vec<&Buffer> = parts.iter().collect();
    let e = download_sharded(&refs, &layout, DType::F32, &dims, &mut [0u8; 8]).unwrap_err();
    assert!(e.to_string().contains("takes 256 bytes"), "{e}");
    let e = download_sharded(&refs[..2], &layout, DType::F32, &dims, &mut [0u8; 256]).unwrap_err();
    assert!(e.to_string().contains("the parts of 2 devices"), "{e}");
}

#[test]
fn serialized_executables_reload_with_identical_results() {
    let client = client(1);
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let reloaded = client.load_executable(&bytes).unwrap();
    let a = [0.5, -1., 2., 1e30, -0., 7.];
    let b = [0.25, 1., -2., 1e30, 0., 1.];
    assert_eq!(
        run_add(&client, &exe, &a, &b),
        run_add(&client, &reloaded, &a, &b)
    );
    assert!(client.load_executable(b"not an executable").is_err());
}

/// Sums an 8x2 matrix over its rows, the rows split over four devices; the result is replicated.
fn row_sum_module(partitioner: Partitioner) -> String {
    let (mesh, arg, result) = match partitioner {
        Partitioner::Gspmd => (
            "",
            r#"{mhlo.sharding = "{devices=[4,1]<=[4]}"}"#,
            r#"{mhlo.sharding = "{replicated}"}"#,
        ),
        Partitioner::Shardy => (
            r#"sdy.mesh @mesh = <["x"=4]>"#,
            r#"{sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}"#,
            r#"{sdy.sharding = #sdy.sharding<@mesh, [{}]>}"#,
        ),
    };
    format!(
        r#"module {{
  {mesh}
  func.func @main(%x: tensor<8x2xf32> {arg}) -> (tensor<2xf32> {result}) {{
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x2xf32>, tensor<f32>) -> tensor<2xf32>
    return %sum : tensor<2xf32>
  }}
}}"#
    )
}

fn check_spmd(partitioner: Partitioner) {
    let client = client(4);
    let exe = client
        .compile_mlir(
            row_sum_module(partitioner).as_bytes(),
            &CompileOptions::spmd(4, partitioner),
        )
        .unwrap();
    check_row_sum(&client, &exe);
}

/// Runs `row_sum_module` on its four devices and checks every device's result.
fn check_row_sum(client: &Client, exe: &Executable) {
    assert_eq!(exe.devices().len(), 4);
    assert_eq!(exe.num_partitions().unwrap(), 4);
    let shards: Vec<Buffer> = exe
        .devices()
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let rows = [i as f32, 1.0, 10.0 * i as f32, 2.0];
            client
                .buffer_from_host(&f32s(&[2, 2], &rows), device)
                .unwrap()
        })
        .collect();
    let args: Vec<Vec<&Buffer>> = shards.iter().map(|b| vec![b]).collect();
    let outputs = exe.execute(&args).unwrap();
    assert_eq!(outputs.len(), 4);
    for (device, out) in exe.devices().iter().zip(&outputs) {
        assert_eq!(out[0].device().unwrap(), *device);
        // rows 0..8: first column 0+0+1+10+2+20+3+30 = 66, second 4*(1+2) = 12
        assert_eq!(
            out[0].to_host().unwrap().to_vec::<f32>().unwrap(),
            vec![66.0, 12.0]
        );
    }
}

#[test]
fn spmd_with_gspmd() {
    check_spmd(Partitioner::Gspmd);
}

#[test]
fn spmd_with_shardy() {
    check_spmd(Partitioner::Shardy);
}

#[test]
fn one_executable_runs_concurrently_from_several_threads() {
    let client = client(1);
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (client, exe) = (&client, &exe);
            scope.spawn(move || {
                for i in 0..200 {
                    let a: Vec<f32> = (0..6).map(|k| (t * 1000 + i * 10 + k) as f32).collect();
                    let b = vec![0.5; 6];
                    let expected: Vec<f32> = a.iter().map(|x| x + 0.5).collect();
                    assert_eq!(run_add(client, exe, &a, &b), expected);
                }
            });
        }
    });
}

#[test]
fn client_options_are_checked_before_the_plugin_sees_them() {
    // The CPU plugin aborts the process on a wrongly typed `cpu_device_count`, so the typed
    // field is the only way to set it.
    let options = ClientOptions {
        extra: vec![(
            "cpu_device_count".into(),
            OptionValue::String("eight".into()),
        )],
        ..Default::default()
    };
    let err = Client::new(&plugin(), &options)
        .err()
        .expect("a refused option");
    assert!(
        err.to_string().contains("ClientOptions::cpu_device_count"),
        "{err}"
    );
    let options = ClientOptions {
        cpu_device_count: Some(0),
        ..Default::default()
    };
    let err = Client::new(&plugin(), &options)
        .err()
        .expect("zero devices");
    assert!(err.to_string().contains("at least 1"), "{err}");
}

#[test]
fn invalid_modules_are_plugin_errors_with_a_location() {
    let client = client(1);
    let err = client
        .compile_mlir(
            b"module { func.func @main( }",
            &CompileOptions::single_device(),
        )
        .err()
        .expect("a syntax error");
    match &err {
        Error::Pjrt { call, message, .. } => {
            assert_eq!(*call, "PJRT_Client_Compile");
            assert!(message.contains("1:"), "{message}");
        }
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn wrong_arguments_are_errors_not_crashes() {
    let client = client(2);
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    let device = &exe.devices()[0];
    let a = client
        .buffer_from_host(&f32s(&[2, 3], &[1.0; 6]), device)
        .unwrap();
    let err = exe.execute_on_one_device(&[&a]).unwrap_err().to_string();
    assert!(err.contains("expected 2 buffers"), "{err}");
    // The plugin checks sizes, not shapes: a 3x2 argument for a 2x3 parameter runs. Callers
    // that know the signature check shapes themselves (as `tpuc run` does).
    let wrong_size = client
        .buffer_from_host(&f32s(&[4, 3], &[1.0; 12]), device)
        .unwrap();
    assert!(exe.execute_on_one_device(&[&a, &wrong_size]).is_err());
    let err = exe
        .execute(&[vec![&a, &a], vec![&a, &a]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("runs on 1 device(s)"), "{err}");
    let other_client = self::client(1);
    let foreign = other_client
        .buffer_from_host(
            &f32s(&[2, 3], &[1.0; 6]),
            &other_client.addressable_devices().unwrap()[0],
        )
        .unwrap();
    assert!(exe.execute_on_one_device(&[&a, &foreign]).is_err());
    let err = client
        .buffer_from_bytes(DType::F32, &[2, 3], &[0; 5], device)
        .unwrap_err();
    assert!(err.to_string().contains("needs 24"), "{err}");
}

#[test]
fn zero_partitions_are_refused_before_the_plugin_sees_them() {
    let client = client(1);
    let options = CompileOptions {
        num_partitions: 0,
        ..CompileOptions::single_device()
    };
    let err = client.compile_mlir(ADD.as_bytes(), &options).err().unwrap();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
}

#[test]
fn files_that_are_not_plugins_are_refused_clearly() {
    let dir = std::env::temp_dir().join(format!("tpuc-pjrt-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.so");
    std::fs::write(&garbage, b"this is not a shared library").unwrap();
    let err = Plugin::load(&garbage).unwrap_err().to_string();
    assert!(
        err.contains("garbage.so") && err.contains("not a loadable shared library"),
        "{err}"
    );

    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    if let Some(libm) = libm {
        let err = Plugin::load(std::path::Path::new(libm))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not export GetPjrtApi"), "{err}");
    }
    let err = Plugin::load(&dir.join("missing.so"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.so"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A module compiled through the cache in one client (process) and loaded in another.
fn cached_compile(
    dir: &std::path::Path,
    client: &Client,
    module: &str,
    options: &CompileOptions,
) -> (Executable, CacheOutcome) {
    CompileCache::new(dir, CompileCache::DEFAULT_MAX_BYTES)
        .compile(client, module.as_bytes(), options, "add")
        .unwrap()
}

fn cache_entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pjrt"))
        .collect();
    found.sort();
    found
}

#[test]
fn compile_cache_says_why_each_miss_was_one() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path(), CompileCache::DEFAULT_MAX_BYTES);
    let client = client(1);
    let single = CompileOptions::single_device();
    let compile = |module: &str, options: &CompileOptions, graph: &str| {
        cache
            .compile(&client, module.as_bytes(), options, graph)
            .unwrap()
            .1
    };
    assert_eq!(compile(ADD, &single, "add"), CacheOutcome::Stored); // a new graph
    assert_eq!(compile(ADD, &single, "add"), CacheOutcome::Hit);
    let other_options = CompileOptions {
        device_assignment: Some(vec![0]),
        ..single.clone()
    };
    assert_eq!(compile(ADD, &other_options, "add"), CacheOutcome::Stored); // its options changed
    let bigger = ADD.replace("2x3", "4x3");
    // Against the last compilation (other options): its options and module (sizes) changed.
    assert_eq!(compile(&bigger, &single, "add"), CacheOutcome::Stored);
    for entry in cache_entries(dir.path()) {
        std::fs::remove_file(entry).unwrap();
    }
    assert_eq!(compile(ADD, &single, "add"), CacheOutcome::Stored); // its entry is gone
    let stats = cache.stats();
    assert_eq!(
        (stats.requests, stats.hits, stats.misses, stats.refused),
        (5, 1, 4, 0)
    );
    assert!(stats.compile_seconds > 0.0);
    let reasons: Vec<(&str, u64)> = stats
        .reasons
        .iter()
        .map(|(r, n)| (r.as_str(), *n))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("changed: options", 1),
            ("changed: options, module (the graph or its sizes)", 1),
            ("entry gone", 1),
            ("new graph", 1),
        ]
    );
    // A line cut short (a process killed while writing it) is skipped, not an error.
    let record = dir.path().join("stats.jsonl");
    let mut text = std::fs::read_to_string(&record).unwrap();
    text.push_str("{\"graph\": \"add\", \"outc");
    std::fs::write(&record, text).unwrap();
    assert_eq!(cache.stats().requests, 5);
    // Clearing the cache clears its record and the eager device's plans too; other files stay.
    std::fs::create_dir_all(cache.device_plans_dir()).unwrap();
    std::fs::write(cache.device_plans_dir().join("a.plan"), b"plan").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    cache.clear().unwrap();
    assert_eq!(cache.stats(), CacheStats::default());
    assert!(!cache.device_plans_dir().exists());
    assert!(dir.path().join("notes.txt").exists());
}

#[test]
fn a_cache_that_must_not_compile_refuses_a_miss_and_dumps_what_it_would_compile() {
    let dir = tempfile::tempdir().unwrap();
    let dumps = tempfile::tempdir().unwrap();
    let client = client(1);
    let single = CompileOptions::single_device();
    let strict = CompileCache::new(dir.path(), CompileCache::DEFAULT_MAX_BYTES).requiring(true);
    let err = match strict.compile(&client, ADD.as_bytes(), &single, "model.pt2") {
        Ok(_) => panic!("a miss compiled in require mode"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("model.pt2 is not in the cache") && err.contains("(new graph)"),
        "{err}"
    );
    assert!(err.contains("TPUC_CACHE_MODE=require"), "{err}");
    assert_eq!(strict.stats().refused, 1);
    let dumping = CompileCache::new(dir.path(), CompileCache::DEFAULT_MAX_BYTES)
        .dumping_misses(Some(dumps.path().to_path_buf()));
    dumping
        .compile(&client, ADD.as_bytes(), &single, "model.pt2")
        .unwrap();
    let dumped: Vec<_> = std::fs::read_dir(dumps.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dumped.len(), 1);
    assert_eq!(std::fs::read_to_string(&dumped[0]).unwrap(), ADD);
    assert!(dumped[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("model_pt2-"));
    // Now it is there: the strict cache serves it.
    assert_eq!(
        strict
            .compile(&client, ADD.as_bytes(), &single, "model.pt2")
            .unwrap()
            .1,
        CacheOutcome::Hit
    );
}

#[test]
fn a_shared_cache_is_read_never_written() {
    let shared = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let client = client(1);
    let single = CompileOptions::single_device();
    // Filled elsewhere (another machine), then read through a local cache.
    cached_compile(shared.path(), &client, ADD, &single);
    let before = cache_entries(shared.path());
    let cache = CompileCache::new(local.path(), CompileCache::DEFAULT_MAX_BYTES)
        .with_shared(vec![shared.path().to_path_buf()]);
    let (exe, outcome) = cache
        .compile(&client, ADD.as_bytes(), &single, "add")
        .unwrap();
    assert_eq!(outcome, CacheOutcome::Hit);
    assert!(
        cache_entries(local.path()).is_empty(),
        "a hit in the shared cache is not copied"
    );
    let out = run_add(&client, &exe, &[1.; 6], &[2.; 6]);
    assert_eq!(out, vec![3.; 6]);
    // A damaged shared entry is compiled locally and stored there; the shared one is left alone.
    let entry = &before[0];
    let mut bytes = std::fs::read(entry).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(entry, &bytes).unwrap();
    let (_, outcome) = cache
        .compile(&client, ADD.as_bytes(), &single, "add")
        .unwrap();
    assert_eq!(outcome, CacheOutcome::Stored);
    assert_eq!(cache_entries(local.path()).len(), 1);
    assert_eq!(std::fs::read(entry).unwrap(), bytes);
}

#[test]
fn processes_filling_one_cache_at_once_leave_sound_entries() {
    // Four writers (threads, each its own client, as processes would be) store the same and
    // different modules in one directory at once; every entry then loads.
    let dir = tempfile::tempdir().unwrap();
    let single = CompileOptions::single_device();
    let modules: Vec<String> = (1..=4)
        .map(|n| ADD.replace("2x3", &format!("{n}x3")))
        .collect();
    std::thread::scope(|scope| {
        for writer in 0..4 {
            let (dir, single, modules) = (dir.path(), &single, &modules);
            scope.spawn(move || {
                let client = client(1);
                let cache = CompileCache::new(dir, CompileCache::DEFAULT_MAX_BYTES);
                for i in 0..4 {
                    let module = &modules[(writer + i) % 4];
                    cache
                        .compile(&client, module.as_bytes(), single, "add")
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(cache_entries(dir.path()).len(), 4);
    let client = client(1);
    let cache = CompileCache::new(dir.path(), CompileCache::DEFAULT_MAX_BYTES);
    for module in &modules {
        assert_eq!(
            cache
                .compile(&client, module.as_bytes(), &single, "add")
                .unwrap()
                .1,
            CacheOutcome::Hit
        );
    }
    let stats = cache.stats();
    assert_eq!(
        stats.requests, 20,
        "every request is on its own line: {stats:?}"
    );
}

#[test]
fn compile_cache_stores_then_loads_instead_of_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let single = CompileOptions::single_device();
    let first = client(1);
    let (exe, outcome) = cached_compile(dir.path(), &first, ADD, &single);
    assert_eq!(outcome, CacheOutcome::Stored);
    assert_eq!(cache_entries(dir.path()).len(), 1);
    // Another client, as in another process: loaded, with the same results.
    let second = client(1);
    let (loaded, outcome) = cached_compile(dir.path(), &second, ADD, &single);
    assert_eq!(outcome, CacheOutcome::Hit);
    let a = [0.5, -1., 2., 1e30, -0., 7.];
    let b = [0.25, 1., -2., 1e30, 0., 1.];
    assert_eq!(
        run_add(&first, &exe, &a, &b),
        run_add(&second, &loaded, &a, &b)
    );
    // Another module, or the same one with other options, is another entry.
    let sub = ADD.replace("stablehlo.add", "stablehlo.subtract");
    let (exe, outcome) = cached_compile(dir.path(), &second, &sub, &single);
    assert_eq!(outcome, CacheOutcome::Stored);
    assert_eq!(run_add(&second, &exe, &a, &b)[..3], [0.25, -2., 4.]);
    let assigned = CompileOptions {
        device_assignment: Some(vec![0]),
        ..CompileOptions::single_device()
    };
    let (_, outcome) = cached_compile(dir.path(), &second, ADD, &assigned);
    assert_eq!(outcome, CacheOutcome::Stored);
    assert_eq!(cache_entries(dir.path()).len(), 3);
}

#[test]
fn compile_cache_serves_spmd_programs() {
    let dir = tempfile::tempdir().unwrap();
    let module = row_sum_module(Partitioner::Gspmd);
    let options = CompileOptions::spmd(4, Partitioner::Gspmd);
    let (_, outcome) = cached_compile(dir.path(), &client(4), &module, &options);
    assert_eq!(outcome, CacheOutcome::Stored);
    let client = client(4);
    let (exe, outcome) = cached_compile(dir.path(), &client, &module, &options);
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(exe.num_partitions().unwrap(), 4);
    check_row_sum(&client, &exe);
}

#[test]
fn compile_cache_replaces_damaged_entries() {
    let dir = tempfile::tempdir().unwrap();
    let client = client(1);
    let single = CompileOptions::single_device();
    cached_compile(dir.path(), &client, ADD, &single);
    let entry = cache_entries(dir.path()).remove(0);
    let sound = std::fs::read(&entry).unwrap();
    let mut flipped = sound.clone();
    *flipped.last_mut().unwrap() ^= 0x55;
    // A changed byte, a truncated file, an empty file, another file format: each is compiled
    // again and the entry rewritten.
    for damaged in [
        flipped,
        sound[..sound.len() / 2].to_vec(),
        vec![],
        b"not an entry".to_vec(),
    ] {
        std::fs::write(&entry, &damaged).unwrap();
        let (exe, outcome) = cached_compile(dir.path(), &client, ADD, &single);
        assert_eq!(outcome, CacheOutcome::Stored);
        assert_eq!(run_add(&client, &exe, &[1.; 6], &[2.; 6]), vec![3.; 6]);
        assert_ne!(std::fs::read(&entry).unwrap(), damaged);
        assert_eq!(
            cached_compile(dir.path(), &client, ADD, &single).1,
            CacheOutcome::Hit
        );
    }
}

#[test]
fn compile_cache_that_cannot_store_still_compiles() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the cache directory should be.
    let blocked = dir.path().join("cache");
    std::fs::write(&blocked, b"").unwrap();
    let client = client(1);
    let (exe, outcome) = cached_compile(&blocked, &client, ADD, &CompileOptions::single_device());
    match outcome {
        CacheOutcome::NotStored(reason) => assert!(reason.contains("cannot write"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(run_add(&client, &exe, &[1.; 6], &[2.; 6]), vec![3.; 6]);
}

#[test]
fn compile_cache_keeps_under_its_size_limit_and_clears() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, b"not the cache's").unwrap();
    // Files a writer that died left behind go once they are old; a recent one may be in use.
    let hex = "0123456789abcdef".repeat(4);
    let stale = dir.path().join(format!("{hex}.tmp1-2"));
    let recent = dir.path().join(format!("{hex}.tmp3-4"));
    for (path, age) in [(&stale, 7200), (&recent, 0)] {
        let file = std::fs::File::create(path).unwrap();
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
        file.set_modified(when).unwrap();
    }
    let client = client(1);
    let tiny = CompileCache::new(dir.path(), 1);
    let single = CompileOptions::single_device();
    let sub = ADD.replace("stablehlo.add", "stablehlo.subtract");
    tiny.compile(&client, ADD.as_bytes(), &single, "add")
        .unwrap();
    let first = cache_entries(dir.path());
    tiny.compile(&client, sub.as_bytes(), &single, "sub")
        .unwrap();
    // Only the newest entry is left; files the cache did not write stay.
    let left = cache_entries(dir.path());
    assert_eq!(left.len(), 1);
    assert_ne!(left, first);
    assert!(other.exists() && recent.exists() && !stale.exists());
    assert_eq!(
        tiny.compile(&client, sub.as_bytes(), &single, "sub")
            .unwrap()
            .1,
        CacheOutcome::Hit
    );
    let (count, bytes) = tiny.usage().unwrap();
    assert_eq!(count, 1);
    assert_eq!(bytes, std::fs::metadata(&left[0]).unwrap().len());
    // Clearing removes the cache's own files, entries and temporaries, and nothing else.
    assert_eq!(tiny.clear().unwrap(), 1);
    assert_eq!(tiny.usage().unwrap(), (0, 0));
    assert!(other.exists() && !recent.exists());
    let missing = CompileCache::new(dir.path().join("never-made"), 1);
    assert_eq!(missing.usage().unwrap(), (0, 0));
}

/// A module whose result takes its first argument's buffer (`tf.aliasing_output`): donated,
/// a buffer over host memory is updated in place; not donated, the host memory stays as it was.
#[test]
fn a_donated_argument_is_updated_in_place() {
    const UPDATE: &str = r#"
module @update {
  func.func @main(%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %arg0, %arg1 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;
    let client = client(1);
    let exe = client
        .compile_mlir(UPDATE.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    let device = &exe.devices()[0];
    let step = client
        .buffer_from_host(&f32s(&[4], &[10.0; 4]), device)
        .unwrap();
    let cache = Arc::new(f32s(&[4], &[1.0, 2.0, 3.0, 4.0]));
    let donated = client
        .buffer_donatable(DType::F32, &[4], cache.clone(), device)
        .unwrap();
    let out = exe
        .execute_donating(&[&step], vec![(0, 0, donated)])
        .unwrap();
    assert_eq!(cache.to_vec::<f32>().unwrap(), [11.0, 12.0, 13.0, 14.0]);
    assert_eq!(
        out[0].device_address().unwrap(),
        cache.bytes().as_ptr() as usize
    );
    // The result keeps the memory; dropping it waits for the plugin, without hanging.
    drop(out);
    // A buffer that shares the memory but is not donated: the result is a buffer of its own.
    let shared = client
        .buffer_sharing(DType::F32, &[4], cache.clone(), device)
        .unwrap();
    let out = exe.execute_on_one_device(&[&shared, &step]).unwrap();
    assert_eq!(
        out[0].to_host().unwrap().to_vec::<f32>().unwrap(),
        [21.0, 22.0, 23.0, 24.0]
    );
    drop((out, shared));
    assert_eq!(cache.to_vec::<f32>().unwrap(), [11.0, 12.0, 13.0, 14.0]);
}

/// Doubles an 8x2 matrix whose rows are split over four devices; the result's layout is left to
/// the partitioner (no sharding), which keeps the rows split.
const DOUBLE_OPEN: &str = r#"module {
  sdy.mesh @mesh = <["x"=4]>
  func.func @main(%x: tensor<8x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> (tensor<8x2xf32>, tensor<2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) {
    %y = stablehlo.add %x, %x : tensor<8x2xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x2xf32>, tensor<f32>) -> tensor<2xf32>
    return %y, %sum : tensor<8x2xf32>, tensor<2xf32>
  }
}"#;

#[test]
fn outputs_left_to_the_partitioner_say_how_it_laid_them_out() {
    let dir = tempfile::tempdir().unwrap();
    let client = client(4);
    let mut options = CompileOptions::spmd(4, Partitioner::Shardy);
    options.propagate_to_outputs = true;
    assert!(client.plugin().reads_output_shardings());
    // Freshly compiled, and loaded from the compile cache.
    for expected in [CacheOutcome::Stored, CacheOutcome::Hit] {
        let (exe, outcome) = cached_compile(dir.path(), &client, DOUBLE_OPEN, &options);
        assert_eq!(outcome, expected);
        let tilings = exe
            .output_tilings()
            .unwrap()
            .expect("the CPU plugin reads shardings");
        assert_eq!(
            tilings[0],
            Tiling::Tiled {
                tiles: vec![4, 1],
                copies: 1,
                devices: vec![0, 1, 2, 3]
            }
        );
        assert_eq!(tilings[1], Tiling::Replicated);
        assert_eq!(
            ShardLayout::from_tiling(&[4], 2, &tilings[0]),
            ShardLayout::new(vec![4], vec![vec![0], vec![]]).ok()
        );
        // Over a 2x2 mesh the same devices hold the rows split over both axes, row-major.
        assert_eq!(
            ShardLayout::from_tiling(&[2, 2], 2, &tilings[0]),
            ShardLayout::new(vec![2, 2], vec![vec![0, 1], vec![]]).ok()
        );
    }
}

#[test]
fn compiled_memory_counts_each_devices_part() {
    // The 8x2 f32 matrix (64 bytes) split over four devices: 16 bytes of arguments each.
    let client = client(4);
    let exe = client
        .compile_mlir(
            row_sum_module(Partitioner::Shardy).as_bytes(),
            &CompileOptions::spmd(4, Partitioner::Shardy),
        )
        .unwrap();
    let split = exe.compiled_memory().unwrap();
    assert_eq!(split.arguments, 16, "{split:?}");
    assert_eq!(split.outputs, 8, "{split:?}");
    let one = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::single_device())
        .unwrap();
    // Two f32[6] arguments, one f32[6] result.
    let whole = one.compiled_memory().unwrap();
    assert_eq!((whole.arguments, whole.outputs), (48, 24), "{whole:?}");
}

#[test]
fn a_portable_executable_runs_on_any_device_of_its_client() {
    let client = client(2);
    let devices = client.addressable_devices().unwrap();
    let exe = client
        .compile_mlir(ADD.as_bytes(), &CompileOptions::portable())
        .unwrap();
    for device in &devices {
        let a = client
            .buffer_from_host(&f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]), device)
            .unwrap();
        let b = client
            .buffer_from_host(&f32s(&[2, 3], &[0.5; 6]), device)
            .unwrap();
        let out = exe.launch_on(device, &[&a, &b]).unwrap();
        assert_eq!(out[0].device().unwrap().id().unwrap(), device.id().unwrap());
        assert_eq!(
            out[0].to_host().unwrap().to_vec::<f32>().unwrap(),
            [1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
        );
    }
    // A program for two devices is not portable.
    let two = CompileOptions {
        num_partitions: 2,
        ..CompileOptions::portable()
    };
    assert!(matches!(
        client.compile_mlir(ADD.as_bytes(), &two).err().unwrap(),
        Error::Invalid(_)
    ));
}
