//! The golden modules: each archive of testdata/lowering (`<case>.pt2`) emits its `<case>.mlir`
//! byte for byte (TPUC_BLESS=1 rewrites them); the same text twice, through the `.fx`
//! interchange as from the archive; bytecode; weights inline.

use std::path::{Path, PathBuf};

use libtest_mimic::{Failed, Trial};
use tpuc_driver::{EmitFormat, LowerOptions, Options};

use tpuc_filetests::testdata::{golden_archives, lowering_dir};

fn emit(path: &Path, lower: &LowerOptions, format: EmitFormat) -> Result<Vec<u8>, Failed> {
    let options = Options {
        lower: lower.clone(),
        ..Options::default()
    };
    Ok(tpuc_driver::emit_file(path, &options, format)
        .map_err(|e| format!("{}: {e:#}", path.display()))?
        .module)
}

fn emit_text(path: &Path) -> Result<String, Failed> {
    let module = emit(path, &LowerOptions::default(), EmitFormat::Text)?;
    Ok(String::from_utf8(module)?)
}

fn golden(case: PathBuf) -> Result<(), Failed> {
    let actual = emit_text(&case)?;
    Ok(tpuc_filetests::golden::compare(
        &case.with_extension("mlir"),
        &actual,
    )?)
}

fn determinism() -> Result<(), Failed> {
    let case = lowering_dir().join("llama_block_core.pt2");
    if emit_text(&case)? != emit_text(&case)? {
        return Err("two compiles of the same archive differ".into());
    }
    Ok(())
}

fn fx_round_trip() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    for case in [
        "resnet_cnn_core",
        "llama_block",
        "dtype_mix",
        "cond_branches",
        "while_loop_core",
    ] {
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
            if emit_text(&fx)? != emit_text(&pt2)? {
                return Err(format!("{case}: .fx and .pt2 compile differently").into());
            }
        }
    }
    Ok(())
}

fn bytecode() -> Result<(), Failed> {
    let case = lowering_dir().join("mlp_core.pt2");
    let module = emit(&case, &LowerOptions::default(), EmitFormat::Bytecode)?;
    if !module.starts_with(b"ML\xefR") {
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
    let text = String::from_utf8(emit(&case, &opts, EmitFormat::Text)?)?;
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

pub fn trials() -> Vec<Trial> {
    let mut trials: Vec<Trial> = golden_archives()
        .into_iter()
        .map(|case| {
            let name = format!("golden::{}", case.file_stem().unwrap().to_string_lossy());
            Trial::test(name, move || golden(case))
        })
        .collect();
    trials.extend([
        Trial::test("golden::determinism", determinism),
        Trial::test("golden::fx_round_trip", fx_round_trip),
        Trial::test("golden::bytecode", bytecode),
        Trial::test("golden::inline_weights", inline_weights),
    ]);
    trials
}
