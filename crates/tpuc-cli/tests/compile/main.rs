//! Golden lowering tests (testdata/lowering/<case>.pt2 -> <case>.mlir, byte for byte),
//! end-to-end checks of the compile pipeline (determinism, the .fx round trip, bytecode, bad
//! input), and execution on the XLA CPU plugin (`execution`). Set TPUC_BLESS=1 to rewrite the
//! expected .mlir files.

mod dynamic;
mod execution;
mod pipeline;
mod runner;
mod sharded;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Failed, Trial};
use tpuc_driver::{EmitFormat, LowerOptions};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn lowering_dir() -> PathBuf {
    root().join("testdata/lowering")
}

fn compile_text(path: &Path) -> Result<String, Failed> {
    let c = tpuc_cli::compile_file(path, &LowerOptions::default(), EmitFormat::Text)
        .map_err(|e| format!("{e:#}"))?;
    Ok(String::from_utf8(c.module).map_err(|e| e.to_string())?)
}

fn golden(case: PathBuf) -> Result<(), Failed> {
    let actual = compile_text(&case)?;
    compare_golden(&case.with_extension("mlir"), &actual)
}

/// `actual` is the module at `expected_path`, byte for byte (with TPUC_BLESS set, it becomes it).
pub fn compare_golden(expected_path: &Path, actual: &str) -> Result<(), Failed> {
    if std::env::var_os("TPUC_BLESS").is_some() {
        std::fs::write(expected_path, actual)?;
        return Ok(());
    }
    let expected = std::fs::read_to_string(expected_path).map_err(|e| {
        format!(
            "{}: {e} (run with TPUC_BLESS=1 to create it)",
            expected_path.display()
        )
    })?;
    if actual != expected {
        let diff = similar::TextDiff::from_lines(expected.as_str(), actual)
            .unified_diff()
            .header("expected", "actual")
            .to_string();
        return Err(format!(
            "{} differs from the lowering:\n{diff}\n(TPUC_BLESS=1 re-blesses)",
            expected_path.display()
        )
        .into());
    }
    Ok(())
}

fn determinism() -> Result<(), Failed> {
    let case = lowering_dir().join("llama_block_core.pt2");
    let a = compile_text(&case)?;
    let b = compile_text(&case)?;
    if a != b {
        return Err("two compiles of the same archive differ".into());
    }
    Ok(())
}

fn fx_round_trip() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    for case in ["resnet_cnn_core", "llama_block", "dtype_mix"] {
        let pt2 = lowering_dir().join(format!("{case}.pt2"));
        let original = tpuc_fx::read_program(&pt2)?;
        for storage in [
            tpuc_fx::fxfile::WeightStorage::Inline,
            tpuc_fx::fxfile::WeightStorage::SideFile,
        ] {
            let fx = dir.path().join(format!("{case}-{storage:?}.fx"));
            tpuc_fx::fxfile::write_fx(&original, &fx, storage)?;
            let back = tpuc_fx::read_program(&fx)?;
            if back != original {
                return Err(format!(
                    "{case}: the .fx file ({storage:?}) does not read back as the same program"
                )
                .into());
            }
            if compile_text(&fx)? != compile_text(&pt2)? {
                return Err(format!("{case}: .fx and .pt2 compile differently").into());
            }
        }
    }
    Ok(())
}

fn bytecode() -> Result<(), Failed> {
    let case = lowering_dir().join("mlp_core.pt2");
    let c = tpuc_cli::compile_file(&case, &LowerOptions::default(), EmitFormat::Bytecode)?;
    if !c.module.starts_with(b"ML\xefR") {
        return Err("bytecode output lacks the MLIR bytecode magic".into());
    }
    Ok(())
}

fn inline_weights() -> Result<(), Failed> {
    let case = lowering_dir().join("mlp.pt2");
    let opts = LowerOptions {
        weights: tpuc_hlo::WeightsMode::Inline,
        ..Default::default()
    };
    let c = tpuc_cli::compile_file(&case, &opts, EmitFormat::Text)?;
    let text = String::from_utf8(c.module)?;
    let header = text
        .lines()
        .find(|l| l.contains("func.func @main"))
        .unwrap_or_default();
    if header.matches("%arg").count() != 1 || !text.contains("dense<\"0x") {
        return Err(format!(
            "inline weights should leave one argument and hex constants:\n{header}"
        )
        .into());
    }
    Ok(())
}

fn expect_error(path: &Path, needles: &[&str]) -> Result<(), Failed> {
    match tpuc_cli::compile_file(path, &LowerOptions::default(), EmitFormat::Text) {
        Ok(_) => Err(format!("{} compiled but should have failed", path.display()).into()),
        Err(e) => {
            let msg = format!("{e:#}");
            for n in needles {
                if !msg.contains(n) {
                    return Err(format!("error for {} lacks {n:?}:\n{msg}", path.display()).into());
                }
            }
            Ok(())
        }
    }
}

fn unsupported_ops_listed_together() -> Result<(), Failed> {
    expect_error(
        &lowering_dir().join("errors/unsupported.pt2"),
        &[
            "2 unsupported ops (3 nodes)",
            "aten.cdist.default (node cdist)",
            "aten.special_i0.default (node special_i0_1)",
            "gen_lowering.py:",
        ],
    )
}

fn in_place_on_views_refused() -> Result<(), Failed> {
    expect_error(
        &lowering_dir().join("errors/view_mutation.pt2"),
        &[
            "in-place aten.fill_.Scalar",
            "a view made by aten.slice.Tensor",
            "run_decompositions",
        ],
    )
}

fn complex_ops_without_complex_lowering_refused() -> Result<(), Failed> {
    expect_error(
        &lowering_dir().join("errors/complex_exp.pt2"),
        &[
            "node exp (aten.exp.default)",
            "not supported: aten.exp.default on complex tensors",
            "complex64",
        ],
    )
}

/// A size only tensor values decide (`.item()` as an index) is refused, naming where it comes
/// from, unspecialised and when a value is given for it: fixing it would be wrong for other data.
fn sizes_tensor_values_decide_refused() -> Result<(), Failed> {
    let model = lowering_dir().join("errors/value_sized.pt2");
    let needles = [
        "tensor values decide the size u0",
        "node item, aten.item.default at",
        "gen_lowering.py:",
        "torch.compile",
    ];
    expect_error(&model, &needles)?;
    for sizes in [BTreeMap::new(), BTreeMap::from([("u0".to_string(), 2)])] {
        let compiled = tpuc_cli::compile_file_with_sizes(
            &model,
            Some(&sizes),
            &LowerOptions::default(),
            EmitFormat::Text,
        );
        crate::execution::expect_err(compiled, &needles)?;
    }
    // Its SymBool nodes (the assertions' conditions) survive the .fx interchange.
    let program = tpuc_fx::read_program(&model)?;
    let tmp = tempfile::tempdir()?;
    let fx = tmp.path().join("value_sized.fx");
    tpuc_fx::fxfile::write_fx(&program, &fx, tpuc_fx::fxfile::WeightStorage::Inline)?;
    if tpuc_fx::read_program(&fx)? != program {
        return Err("the .fx file does not read back as the same program".into());
    }
    expect_error(&fx, &needles)
}

fn bad_files() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let good = std::fs::read(lowering_dir().join("mlp.pt2"))?;
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        (
            "empty.pt2",
            vec![],
            vec!["neither a torch.export .pt2 archive"],
        ),
        (
            "garbage.pt2",
            b"hello world, not a zip".to_vec(),
            vec!["garbage.pt2", "neither"],
        ),
        (
            "truncated.pt2",
            good[..good.len() / 2].to_vec(),
            vec!["truncated.pt2", "not a valid .pt2 archive"],
        ),
        (
            "bad.fx",
            b"TPUCFX1\n\xff\xff\xff".to_vec(),
            vec!["bad.fx", "corrupt or truncated protobuf"],
        ),
    ];
    for (name, bytes, needles) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes)?;
        expect_error(&p, &needles)?;
    }
    expect_error(
        &dir.path().join("missing.pt2"),
        &["missing.pt2", "No such file"],
    )?;
    Ok(())
}

/// Rewrites model.json inside a copy of an archive, to test semantic validation.
fn with_model_json(
    src: &Path,
    dst: &Path,
    edit: impl Fn(&mut serde_json::Value),
) -> Result<(), Failed> {
    let mut zin = zip::ZipArchive::new(std::fs::File::open(src)?)?;
    let mut zout = zip::ZipWriter::new(std::fs::File::create(dst)?);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..zin.len() {
        let mut f = zin.by_index(i)?;
        let name = f.name().to_string();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut data)?;
        if name.ends_with("models/model.json") {
            let mut v: serde_json::Value = serde_json::from_slice(&data)?;
            edit(&mut v);
            data = serde_json::to_vec(&v)?;
        }
        zout.start_file(name, opts)?;
        std::io::Write::write_all(&mut zout, &data)?;
    }
    zout.finish()?;
    Ok(())
}

fn invalid_graphs() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let src = lowering_dir().join("mlp.pt2");
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "version",
            Box::new(|v| v["schema_version"]["major"] = 99.into()),
            vec!["unsupported schema version 99"],
        ),
        (
            "dangling",
            Box::new(|v| {
                v["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"]["as_tensor"]["name"] =
                    "nowhere".into()
            }),
            vec!["node linear", "undefined value nowhere"],
        ),
        (
            "order",
            Box::new(|v| {
                let nodes = v["graph_module"]["graph"]["nodes"].as_array_mut().unwrap();
                nodes.reverse();
            }),
            vec!["before it is defined"],
        ),
        (
            "dtype",
            Box::new(|v| v["graph_module"]["graph"]["tensor_values"]["x"]["dtype"] = 9.into()),
            vec!["tensor x", "complex32"],
        ),
        (
            "weight_type",
            Box::new(|v| {
                v["graph_module"]["graph"]["tensor_values"]["p_fc1_weight"]["sizes"][0] =
                    serde_json::json!({"as_int": 31})
            }),
            vec!["graph input p_fc1_weight", "type mismatch"],
        ),
        (
            "kind",
            Box::new(|v| {
                let arg = &mut v["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"];
                *arg = serde_json::json!({"as_mystery": 1});
            }),
            vec!["models/model.json", "as_mystery"],
        ),
    ];
    for (name, edit, needles) in cases {
        let p = dir.path().join(format!("{name}.pt2"));
        with_model_json(&src, &p, edit)?;
        expect_error(&p, &needles)?;
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    // The tests' own cache of compiled executables, not the user's (set before any thread
    // starts; the directory goes when the tests end).
    let cache = tempfile::tempdir().expect("a temporary directory");
    if std::env::var_os("TPUC_CACHE_DIR").is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("TPUC_CACHE_DIR", cache.path()) };
    }
    let mut cases: Vec<PathBuf> = std::fs::read_dir(lowering_dir())
        .expect("testdata/lowering exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pt2"))
        .collect();
    cases.sort();
    let mut trials: Vec<Trial> = cases
        .iter()
        .cloned()
        .map(|case| {
            let name = format!("golden::{}", case.file_stem().unwrap().to_string_lossy());
            Trial::test(name, move || golden(case))
        })
        .collect();
    trials.extend([
        Trial::test("determinism", determinism),
        Trial::test("fx_round_trip", fx_round_trip),
        Trial::test("bytecode", bytecode),
        Trial::test("inline_weights", inline_weights),
        Trial::test(
            "errors::unsupported_ops_listed_together",
            unsupported_ops_listed_together,
        ),
        Trial::test("errors::bad_files", bad_files),
        Trial::test(
            "errors::in_place_on_views_refused",
            in_place_on_views_refused,
        ),
        Trial::test("errors::invalid_graphs", invalid_graphs),
        Trial::test(
            "errors::complex_ops_without_complex_lowering_refused",
            complex_ops_without_complex_lowering_refused,
        ),
        Trial::test(
            "errors::sizes_tensor_values_decide_refused",
            sizes_tensor_values_decide_refused,
        ),
    ]);
    trials.extend(execution::trials(&cases));
    trials.extend(dynamic::trials());
    trials.extend(pipeline::trials());
    trials.extend(sharded::trials());
    let conclusion = libtest_mimic::run(&args, trials);
    drop(cache);
    conclusion.exit();
}
