//! `.pt2` -> StableHLO text for a large graph, split into reading, lowering (and constant folding
//! within it) and emission.
//! The model comes from tools/gen_bench_model.py (tools/bench_compile.sh runs both).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tpuc_hlo::{EmitFormat, LowerOptions};

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
    let mut g = c.benchmark_group("compile");
    g.throughput(Throughput::Elements(program.graph.nodes.len() as u64));
    g.bench_function("read", |b| b.iter(|| tpuc_fx::read_program(&path).unwrap()));
    g.bench_function("lower", |b| {
        b.iter(|| tpuc_hlo::lower(&program, &opts).unwrap())
    });
    // Constant folding alone (part of `lower`), re-run over a copy of the lowered module made
    // outside the timing.
    g.bench_function("fold", |b| {
        b.iter_batched_ref(
            || lowered.module.main.clone(),
            tpuc_hlo::fold::fold_constants,
            BatchSize::LargeInput,
        )
    });
    g.bench_function("emit_text", |b| {
        b.iter(|| tpuc_hlo::emit(&lowered.module, EmitFormat::Text).unwrap())
    });
    g.bench_function("total", |b| {
        b.iter(|| tpuc_cli::compile_file(&path, &opts, EmitFormat::Text).unwrap())
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
