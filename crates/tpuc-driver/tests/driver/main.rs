//! The driver's tests: bad programs refused by name, execution on the XLA CPU plugin
//! (`execution`: every golden case against torch's outputs, bad inputs), the runtime layer
//! (`runner`: a model opened and run as `tpuc run` runs it), dynamic sizes and buckets, the
//! pipeline's options, programs over device meshes and user kernels. The golden modules themselves
//! (testdata/lowering/<case>.pt2 -> <case>.mlir) are crates/tpuc-filetests'; the `tpuc` command
//! is crates/tpuc-cli/tests/cli's.

mod control_flow;
mod dynamic;
mod execution;
mod kernels;
mod pipeline;
mod runner;
mod sharded;

use std::collections::BTreeMap;
use std::path::Path;

use libtest_mimic::{Arguments, Failed, Trial};
use tpuc_driver::{EmitFormat, Emitted, LowerOptions, Options};

use tpuc_filetests::testdata::lowering_dir;

/// Compiles a `.pt2` or `.fx` file as `tpuc compile` does, its symbolic sizes (if any) fixed
/// to `sizes` first.
pub fn emit_file(
    path: &Path,
    sizes: Option<&BTreeMap<String, i64>>,
    lower: &LowerOptions,
    format: EmitFormat,
) -> anyhow::Result<Emitted> {
    let options = Options {
        lower: lower.clone(),
        sizes: sizes.cloned(),
        ..Options::default()
    };
    Ok(tpuc_driver::emit_file(path, &options, format)?)
}

fn expect_error(path: &Path, needles: &[&str]) -> Result<(), Failed> {
    match emit_file(path, None, &LowerOptions::default(), EmitFormat::Text) {
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
        let compiled = emit_file(
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
    let cache = tpuc_filetests::testdata::private_cache();
    let cases = tpuc_filetests::testdata::golden_archives();
    let mut trials = vec![
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
    ];
    trials.extend(execution::trials(&cases));
    trials.extend(control_flow::trials());
    trials.extend(kernels::trials());
    trials.extend(dynamic::trials());
    trials.extend(pipeline::trials());
    trials.extend(sharded::trials());
    let conclusion = libtest_mimic::run(&args, trials);
    drop(cache);
    conclusion.exit();
}
