//! A program exported with dynamic shapes (testdata/lowering/dynamic, from
//! tools/gen_lowering.py): refused unspecialised, compiled for the exported or chosen sizes, run
//! at the sizes of its inputs with torch's results, and bad sizes refused before anything runs.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::runner::Runner;
use libtest_mimic::{Failed, Trial};
use tpuc_driver::RunOptions;
use tpuc_driver::{EmitFormat, LowerOptions};
use tpuc_npy::read_npz;

use crate::execution::{compare_all, expect_err};
use crate::lowering_dir;

fn dir() -> PathBuf {
    lowering_dir().join("dynamic")
}

fn model() -> PathBuf {
    dir().join("model.pt2")
}

/// The input sets gen_lowering.py wrote: the exported sizes (batch 3, sequence 5) and others.
const SIZES: [&str; 3] = ["b3_s5", "b8_s9", "b64_s2"];

fn compile_signature(sizes: Option<&BTreeMap<String, i64>>) -> anyhow::Result<String> {
    let compiled = crate::emit_file(&model(), sizes, &LowerOptions::default(), EmitFormat::Text)?;
    let text = String::from_utf8(compiled.module)?;
    Ok(text
        .lines()
        .find(|l| l.contains("func.func @main"))
        .unwrap_or_default()
        .to_string())
}

fn compile_refused_or_specialised() -> Result<(), Failed> {
    expect_err(
        compile_signature(None),
        &[
            "symbolic sizes",
            "s17 in [2, 64], exported with 3",
            "s27 in [2, 512], exported with 5",
            "--specialize",
        ],
    )?;
    let exported = compile_signature(Some(&BTreeMap::new())).map_err(|e| format!("{e:#}"))?;
    let chosen = compile_signature(Some(&BTreeMap::from([("s27".to_string(), 9)])))
        .map_err(|e| format!("{e:#}"))?;
    for (signature, wanted) in [
        (
            &exported,
            ["tensor<3x5x16xf32>", "tensor<3x20xf32>", "tensor<3x7xf32>"],
        ),
        (
            &chosen,
            ["tensor<3x9x16xf32>", "tensor<3x36xf32>", "tensor<3x11xf32>"],
        ),
    ] {
        if let Some(missing) = wanted.iter().find(|w| !signature.contains(*w)) {
            return Err(format!("no {missing} in {signature}").into());
        }
    }
    // A size outside the exported range, a symbol the program lacks.
    expect_err(
        compile_signature(Some(&BTreeMap::from([("s17".to_string(), 65)]))),
        &["size s17=65 is outside the range [2, 64]"],
    )?;
    expect_err(
        compile_signature(Some(&BTreeMap::from([("batch".to_string(), 4)]))),
        &["no symbolic size batch", "its symbols: s17"],
    )?;
    Ok(())
}

/// A runner of the program `model` for these inputs' shapes and the `sizes` given.
fn runner_for(
    model: &Path,
    inputs: &[tpuc_pjrt::HostTensor],
    sizes: BTreeMap<String, i64>,
) -> anyhow::Result<Runner> {
    let options = RunOptions {
        sizes,
        input_dims: Some(inputs.iter().map(|t| t.dims().to_vec()).collect()),
        ..RunOptions::default()
    };
    Runner::new(model, None, &options)
}

/// Runs `model` on the input set `stem` at the inputs' sizes; torch's results are expected.
fn matches_torch(model: &Path, stem: &str) -> Result<(), String> {
    let npz = |what: &str| {
        read_npz(&dir().join(format!("{stem}.{what}.npz"))).map_err(|e| format!("{stem}: {e:#}"))
    };
    let (inputs, expected) = (npz("inputs")?, npz("expected")?);
    let runner =
        runner_for(model, &inputs, BTreeMap::new()).map_err(|e| format!("{stem}: {e:#}"))?;
    let outputs = runner.run(inputs).map_err(|e| format!("{stem}: {e:#}"))?;
    compare_all(&outputs, &expected).map_err(|e| format!("{stem}: {e}"))
}

/// Each input set runs at its own sizes and matches torch, including a sequence length exported
/// as 2*s44 (the inputs' 14 gives s44 = 7).
fn runs_at_the_inputs_sizes() -> Result<(), Failed> {
    for stem in SIZES {
        matches_torch(&model(), stem)?;
    }
    Ok(matches_torch(&dir().join("derived.pt2"), "derived_s14")?)
}

fn bad_sizes_refused() -> Result<(), Failed> {
    let good = read_npz(&dir().join("b8_s9.inputs.npz")).map_err(|e| format!("{e:#}"))?;
    let zeros = |dims: &[i64]| tpuc_pjrt::HostTensor::zeros(tpuc_pjrt::DType::F32, dims);
    // x's batch 4, y's batch 8: one symbol, two sizes.
    expect_err(
        runner_for(
            &model(),
            &[zeros(&[4, 9, 16])?, good[1].clone()],
            BTreeMap::new(),
        ),
        &[
            "input 1 (y) dimension 0 is 8",
            "input 0 (x) dimension 0 is 4",
            "size s17",
        ],
    )?;
    expect_err(
        runner_for(
            &model(),
            &[zeros(&[65, 9, 16])?, zeros(&[65, 2, 16])?],
            BTreeMap::new(),
        ),
        &["size s17=65 is outside the range [2, 64]"],
    )?;
    expect_err(
        runner_for(&model(), &good, BTreeMap::from([("s17".to_string(), 4)])),
        &["size s17 is given as 4 but the inputs have 8"],
    )?;
    // A static dimension of the wrong size, or a wrong rank, is the signature check's to
    // report, with the declared sizes.
    let runner = runner_for(&model(), &good, BTreeMap::new()).map_err(|e| format!("{e:#}"))?;
    expect_err(
        runner.run(vec![zeros(&[8, 9, 15])?, good[1].clone()]),
        &["input 0 (x) must be float32 [s17, s27, 16] ([8, 9, 16] here)"],
    )?;
    let runner = runner_for(
        &model(),
        &[zeros(&[8, 9])?, good[1].clone()],
        BTreeMap::new(),
    )
    .map_err(|e| format!("{e:#}"))?;
    expect_err(
        runner.run(vec![zeros(&[8, 9])?, good[1].clone()]),
        &[
            "input 0 (x) must be float32 [s17, s27, 16] ([8, 5, 16] here)",
            "[8, 9] was given",
        ],
    )?;
    // Sizes for a program without symbols.
    let options = RunOptions {
        sizes: BTreeMap::from([("s0".to_string(), 2)]),
        ..RunOptions::default()
    };
    expect_err(
        Runner::new(&lowering_dir().join("mlp.pt2"), None, &options),
        &["no symbolic size s0", "all static"],
    )?;
    Ok(())
}

/// The .fx format keeps the symbols' ranges: the converted program reads back the same.
fn fx_keeps_ranges() -> Result<(), Failed> {
    let original = tpuc_fx::read_program(&model())?;
    if original.graph().symbol_ranges.len() != 2 {
        return Err(format!(
            "expected 2 symbol ranges, got {:?}",
            original.graph().symbol_ranges
        )
        .into());
    }
    let tmp = tempfile::tempdir()?;
    let fx = tmp.path().join("dynamic.fx");
    tpuc_fx::fxfile::write_fx(&original, &fx, tpuc_fx::fxfile::WeightStorage::Inline)?;
    if tpuc_fx::read_program(&fx)? != original {
        return Err("the .fx file does not read back as the same program".into());
    }
    Ok(())
}

/// With buckets (decoding.pt2: a cache of dynamic length grown by one entry, attended over),
/// the input sets whose sizes share a bucket share one executable: the second is loaded from
/// the cache the first filled; each matches torch, its outputs at their own sizes.
fn sizes_share_buckets() -> Result<(), Failed> {
    let decoding = dir().join("decoding.pt2");
    let cache = tempfile::tempdir()?;
    let options = |inputs: &[tpuc_pjrt::HostTensor], cache_dir: String| RunOptions {
        input_dims: Some(inputs.iter().map(|t| t.dims().to_vec()).collect()),
        buckets: Some(tpuc_driver::Buckets::default()),
        cache_dir: Some(cache_dir),
        ..RunOptions::default()
    };
    let mut seen = Vec::new();
    for stem in ["decoding_s5", "decoding_s9", "decoding_s40"] {
        let npz = |what: &str| read_npz(&dir().join(format!("{stem}.{what}.npz")));
        let (inputs, expected) = (npz("inputs")?, npz("expected")?);
        let runner = Runner::new(
            &decoding,
            None,
            &options(&inputs, cache.path().display().to_string()),
        )
        .map_err(|e| format!("{stem}: {e:#}"))?;
        if let Some(why) = runner.not_padded() {
            return Err(format!("{stem}: not compiled for a bucket: {why}").into());
        }
        let outputs = runner.run(inputs).map_err(|e| format!("{stem}: {e:#}"))?;
        compare_all(&outputs, &expected).map_err(|e| format!("{stem}: {e}"))?;
        seen.push((
            runner.inputs()[0].dims.clone(),
            runner.timings.cache.clone(),
        ));
    }
    use tpuc_driver::CacheOutcome::{Hit, Stored};
    let want = [
        (vec![2, 16, 16], Some(Stored)),
        (vec![2, 16, 16], Some(Hit)),
        (vec![2, 64, 16], Some(Stored)),
    ];
    if seen != want {
        return Err(format!("(padded input shape, cache outcome) per size: {seen:?}").into());
    }
    // An input larger than the bucket the executable was compiled for is refused.
    let small = read_npz(&dir().join("decoding_s5.inputs.npz"))?;
    let runner = Runner::new(&decoding, None, &options(&small, "off".into()))
        .map_err(|e| format!("{e:#}"))?;
    let mut large = small.clone();
    large[0] = tpuc_pjrt::HostTensor::zeros(tpuc_pjrt::DType::F32, &[2, 17, 16])?;
    expect_err(
        runner.run(large),
        &[
            "input 0 (cache) must be float32 [2, s",
            "[2, 17, 16] was given",
        ],
    )?;
    // A program with an op padding would change is compiled for its sizes, and says why.
    let good = read_npz(&dir().join("b8_s9.inputs.npz"))?;
    let runner =
        Runner::new(&model(), None, &options(&good, "off".into())).map_err(|e| format!("{e:#}"))?;
    match runner.not_padded() {
        Some(why) if why.contains("cannot be padded") && why.contains("view") => Ok(()),
        other => Err(format!("model.pt2 compiled per size for the reason {other:?}").into()),
    }
}

/// An RNN written with scan over a sequence of dynamic length, compiled per bucket (both input
/// sets in the bucket 16 of steps): its loop stops at each set's true length, so the last
/// state matches torch's, as it does compiled for the sizes themselves.
fn a_scan_over_a_padded_length_stops_at_its_true_length() -> Result<(), Failed> {
    let scan = dir().join("scan.pt2");
    for buckets in [Some(tpuc_driver::Buckets::default()), None] {
        for stem in ["scan_b3_s5", "scan_b2_s9"] {
            let npz = |what: &str| read_npz(&dir().join(format!("{stem}.{what}.npz")));
            let (inputs, expected) = (npz("inputs")?, npz("expected")?);
            let options = RunOptions {
                input_dims: Some(inputs.iter().map(|t| t.dims().to_vec()).collect()),
                buckets: buckets.clone(),
                cache_dir: Some("off".into()),
                ..RunOptions::default()
            };
            let runner =
                Runner::new(&scan, None, &options).map_err(|e| format!("{stem}: {e:#}"))?;
            if let (Some(_), Some(why)) = (&buckets, runner.not_padded()) {
                return Err(format!("{stem}: not compiled for a bucket: {why}").into());
            }
            let outputs = runner.run(inputs).map_err(|e| format!("{stem}: {e:#}"))?;
            compare_all(&outputs, &expected).map_err(|e| format!("{stem}: {e}"))?;
        }
    }
    Ok(())
}

/// A program whose size has grown into a larger bucket gets the bucket after it compiled in the
/// background: the sequence's next call finds it compiled (or waits for it), not compiling it
/// itself; a program compiled in the background is found by the compile that needs it.
fn next_bucket_compiled_ahead() -> Result<(), Failed> {
    let target = std::sync::Arc::new(tpuc_driver::Target::open(Some("cpu"), 1, &[])?);
    let decoding = dir().join("decoding.pt2");
    let source = tpuc_driver::Source::File(&decoding);
    let small = read_npz(&dir().join("decoding_s5.inputs.npz"))?;
    // The cache's length in each call (decoding_s5's inputs with a cache of that length).
    let options = |length: i64| {
        let mut dims: Vec<Vec<i64>> = small.iter().map(|t| t.dims().to_vec()).collect();
        dims[0][1] = length;
        RunOptions {
            input_dims: Some(dims),
            buckets: Some(tpuc_driver::Buckets::default()),
            cache_dir: Some("off".into()),
            ..RunOptions::default()
        }
        .compile_options()
    };
    let mut started = Vec::new();
    let mut reused = Vec::new();
    for length in [5, 9, 17, 20, 40, 100] {
        let (compiled, found) = target.compile(source, &options(length))?;
        reused.push((found, compiled.ahead));
        started.push(target.compile_next_bucket(source, &options(length), &compiled)?);
    }
    // 5 and 9 share bucket 16; 17 grows it to 32 (64 starts compiling); 20 stays; 40 finds 64
    // compiled ahead (compiled for it: not reused) and starts 128, which 100 finds.
    let (no, yes, ahead) = ((false, false), (true, false), (false, true));
    if started != [false, false, true, false, true, true]
        || reused != [no, yes, no, yes, ahead, ahead]
    {
        return Err(format!("started ahead {started:?}, (reused, ahead) {reused:?}").into());
    }
    // A program compiled in the background (here, for its sizes) is found by the compile that
    // needs it, and is not started twice.
    let exact = RunOptions {
        sizes: [("s65".to_string(), 7)].into(),
        cache_dir: Some("off".into()),
        ..RunOptions::default()
    }
    .compile_options();
    let started = target.compile_in_background(source.to_owned_source(), exact.clone())?;
    let again = target.compile_in_background(source.to_owned_source(), exact.clone())?;
    if !started || again || !target.compile(source, &exact)?.0.ahead {
        return Err(format!("in the background: started {started}, again {again}").into());
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "dynamic::a_scan_over_a_padded_length_stops_at_its_true_length",
            a_scan_over_a_padded_length_stops_at_its_true_length,
        ),
        Trial::test("dynamic::sizes_share_buckets", sizes_share_buckets),
        Trial::test(
            "dynamic::next_bucket_compiled_ahead",
            next_bucket_compiled_ahead,
        ),
        Trial::test(
            "dynamic::compile_refused_or_specialised",
            compile_refused_or_specialised,
        ),
        Trial::test(
            "dynamic::runs_at_the_inputs_sizes",
            runs_at_the_inputs_sizes,
        ),
        Trial::test("dynamic::bad_sizes_refused", bad_sizes_refused),
        Trial::test("dynamic::fx_keeps_ranges", fx_keeps_ranges),
    ]
}
