//! `.pt2` -> StableHLO text for a large graph, split into reading, lowering, the passes
//! (constant folding alone too) and emission, the whole of it, and a compile of the same program
//! again in the process (answered by the in-process cache).
//! The model comes from tools/gen_bench_model.py (tools/bench_compile.sh runs both).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tpuc_driver::{EmitFormat, LowerOptions, Options, Source, Target};
use tpuc_hlo::passes::{fold::fold_constants, pipeline, PipelineOptions};

fn model() -> PathBuf {
    match std::env::var_os("TPUC_BENCH_MODEL") {
        Some(p) => PathBuf::from(p),
        None => panic!("set TPUC_BENCH_MODEL to a .pt2 made by tools/gen_bench_model.py (tools/bench_compile.sh does)"),
    }
}

fn bench(c: &mut Criterion) {
    let path = model();
    let program = tpuc_fx::read_program(&path).expect("benchmark model reads");
    let opts = LowerOptions::default();
    let lowered = tpuc_hlo::lower(&program, &opts).expect("benchmark model lowers");
    // What a release build runs: no verifier between passes.
    let passes = PipelineOptions {
        verify: false,
        ..PipelineOptions::default()
    };
    let cleaned = pipeline(lowered.module.clone(), &passes)
        .expect("benchmark model passes")
        .main;
    let mut g = c.benchmark_group("compile");
    g.throughput(Throughput::Elements(program.graph().nodes.len() as u64));
    g.bench_function("read", |b| b.iter(|| tpuc_fx::read_program(&path).unwrap()));
    g.bench_function("lower", |b| {
        b.iter(|| tpuc_hlo::lower(&program, &opts).unwrap())
    });
    // Each pass takes the module by value: copies of it are made outside the timing.
    g.bench_function("passes", |b| {
        b.iter_batched(
            || lowered.module.clone(),
            |m| pipeline(m, &passes).unwrap(),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("fold", |b| {
        b.iter_batched(
            || lowered.module.clone(),
            fold_constants,
            BatchSize::LargeInput,
        )
    });
    g.bench_function("verify", |b| {
        b.iter(|| tpuc_hlo::ir::verify(&cleaned).unwrap())
    });
    g.bench_function("emit_text", |b| {
        b.iter(|| tpuc_emit::emit(&cleaned, EmitFormat::Text).unwrap())
    });
    g.bench_function("total", |b| {
        b.iter(|| tpuc_cli::compile_file(&path, &opts, EmitFormat::Text).unwrap())
    });
    // Compiling the program again in the process that compiled it: the in-process cache
    // answers before anything is read, lowered or emitted.
    let target = Target::open(Some("cpu"), 1, &[]).expect("the CPU plugin starts");
    let options = Options {
        sizes: Some(Default::default()),
        ..Options::default()
    };
    let (_, reused) = target.compile(Source::File(&path), &options).unwrap();
    assert!(!reused);
    g.bench_function("compiled_again", |b| {
        b.iter(|| {
            let (_, reused) = target.compile(Source::File(&path), &options).unwrap();
            assert!(reused);
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
