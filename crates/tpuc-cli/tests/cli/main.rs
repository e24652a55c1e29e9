//! The `tpuc` command as its users run it: the built binary in a child process, its arguments,
//! what it prints and writes, its exit status and its errors. What the command calls is tested
//! where it lives (crates/tpuc-driver/tests/driver, crates/tpuc-filetests).

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Arguments, Failed, Trial};
use tpuc_npy::compare::compare_all;
use tpuc_npy::{read_npy, read_npz};
use tpuc_pjrt::HostTensor;

use tpuc_filetests::testdata::lowering_dir;

/// The dynamic-shape model and its input sets.
fn dir() -> PathBuf {
    lowering_dir().join("dynamic")
}

fn model() -> PathBuf {
    dir().join("model.pt2")
}

/// `tpuc compile` refuses without --specialize and takes --size; `tpuc run` takes the sizes
/// from its inputs.
fn sizes_of_a_dynamic_program() -> Result<(), Failed> {
    let refused = tpuc().arg("compile").arg(model()).output()?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    if refused.status.success() || !stderr.contains("symbolic sizes") {
        return Err(format!("compile without --specialize:\n{stderr}").into());
    }
    let sized = tpuc()
        .arg("compile")
        .arg(model())
        .args(["--size", "s17=8,s27=9"])
        .output()?;
    if !sized.status.success()
        || !String::from_utf8_lossy(&sized.stdout).contains("tensor<8x9x16xf32>")
    {
        return Err(format!(
            "compile --size:\n{}",
            String::from_utf8_lossy(&sized.stderr)
        )
        .into());
    }
    let tmp = tempfile::tempdir()?;
    let run = tpuc()
        .arg("run")
        .arg(model())
        .arg("--input")
        .arg(dir().join("b8_s9.inputs.npz"))
        .arg("--expect")
        .arg(dir().join("b8_s9.expected.npz"))
        .arg("--out")
        .arg(tmp.path())
        .output()?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    if !run.status.success()
        || !stdout.contains("all 2 outputs match")
        || !stdout.contains("[8, 36]")
    {
        return Err(format!("run:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr)).into());
    }
    Ok(())
}

/// `--size` settings are SYMBOL=SIZE, each symbol once; a bad one is refused, quoting it.
fn size_settings_are_checked() -> Result<(), Failed> {
    for (settings, said) in [
        (&["s0"][..], "--size \"s0\": expected SYMBOL=SIZE"),
        (&["=3"][..], "--size \"=3\": expected SYMBOL=SIZE"),
        (&["s0=x"][..], "--size \"s0=x\": expected SYMBOL=SIZE"),
        (&["s17=2", "s17=3"][..], "size s17 is given twice"),
    ] {
        let mut command = tpuc();
        command.arg("compile").arg(model());
        for setting in settings {
            command.args(["--size", setting]);
        }
        let out = command.output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains(said) {
            return Err(format!("--size {settings:?}: expected `{said}`, got: {stderr}").into());
        }
    }
    Ok(())
}

/// `tpuc compile --emit ir` prints tpuc's own IR after the passes: by default with the fusion
/// stage's composites (the first layer and its ReLU one `tpuc.linear`, its function after
/// `main`, each op at its own node), with `--fusion none` every op as lowered.
fn cli_emits_the_ir() -> Result<(), Failed> {
    for (fusion, expected) in [
        (
            None,
            &[
                "func @main(%0: tensor<32x16xf32>",
                "stablehlo.composite %4, %0, %1 @tpuc_linear_impl name=\"tpuc.linear\" attributes={activation=\"relu\"}",
                "func private @tpuc_linear_impl(",
                "stablehlo.dot_general %5, %6 batch=[]x[] contracting=[1]x[1] precision=highest : tensor<4x32xf32>  // linear (",
            ][..],
        ),
        (
            Some("none"),
            &[
                "func @main(%0: tensor<32x16xf32>",
                "stablehlo.dot_general %4, %0 batch=[]x[] contracting=[1]x[1] precision=highest",
                "// linear (",
                "return",
            ][..],
        ),
    ] {
        let mut command = tpuc();
        command.args(["compile", "--emit", "ir"]);
        if let Some(choice) = fusion {
            command.args(["--fusion", choice]);
        }
        let out = command.arg(lowering_dir().join("mlp.pt2")).output()?;
        let text = String::from_utf8(out.stdout)?;
        if !out.status.success() || expected.iter().any(|e| !text.contains(e)) {
            return Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)).into());
        }
    }
    Ok(())
}

/// `tpuc compile A B -o DIR` compiles both (side by side) into DIR/A.mlir and DIR/B.mlir, each
/// the module compiling it alone writes; a program that fails is named and the others are
/// written; several programs need a directory.
fn cli_compiles_several_programs() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("modules");
    let names = ["mlp", "broadcasting", "dtype_mix"];
    let mut command = tpuc();
    command.arg("compile").arg("-o").arg(&out);
    for name in names {
        command.arg(lowering_dir().join(format!("{name}.pt2")));
    }
    let both = command.output()?;
    if !both.status.success() {
        return Err(String::from_utf8_lossy(&both.stderr).into_owned().into());
    }
    for name in names {
        let alone = tpuc()
            .arg("compile")
            .arg(lowering_dir().join(format!("{name}.pt2")))
            .output()?;
        if std::fs::read(out.join(format!("{name}.mlir")))? != alone.stdout {
            return Err(format!("{name}.mlir differs from compiling {name}.pt2 alone").into());
        }
    }
    let broken = dir.path().join("broken.pt2");
    std::fs::write(&broken, b"not an archive")?;
    let partly = tpuc()
        .arg("compile")
        .arg("-o")
        .arg(dir.path().join("partly"))
        .arg(&broken)
        .arg(lowering_dir().join("mlp.pt2"))
        .output()?;
    let stderr = String::from_utf8_lossy(&partly.stderr);
    if partly.status.success()
        || !stderr.contains("broken.pt2")
        || !stderr.contains("1 of 2 programs failed")
        || !dir.path().join("partly/mlp.mlir").is_file()
    {
        return Err(format!("a failing program among several:\n{stderr}").into());
    }
    let to_stdout = tpuc()
        .arg("compile")
        .arg(lowering_dir().join("mlp.pt2"))
        .arg(lowering_dir().join("broadcasting.pt2"))
        .output()?;
    let stderr = String::from_utf8_lossy(&to_stdout.stderr);
    if to_stdout.status.success() || !stderr.contains("need -o DIRECTORY") {
        return Err(format!("several programs to standard output:\n{stderr}").into());
    }
    Ok(())
}

/// `tpuc run --repeat N` runs N more times and reports the steady state.
fn cli_repeats_runs() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let case = lowering_dir().join("mlp.pt2");
    let out = tpuc()
        .args(["run", "--repeat", "3", "--out"])
        .arg(dir.path())
        .arg("--input")
        .arg(case.with_extension("inputs.npz"))
        .arg(&case)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !stderr.contains("(then 3 more: median ") {
        return Err(stderr.into_owned().into());
    }
    Ok(())
}

fn tpuc() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tpuc"));
    command.env("TF_CPP_MIN_LOG_LEVEL", "3");
    command
}

/// `tpuc run CASE` on its inputs, writing to `out`, comparing with `expected`.
fn tpuc_run(case: &Path, out: &Path, expected: &Path) -> Command {
    let mut command = tpuc();
    command
        .arg("run")
        .arg(case)
        .arg("--input")
        .arg(case.with_extension("inputs.npz"))
        .arg("--out")
        .arg(out)
        .arg("--expect")
        .arg(expected);
    command
}

/// `tpuc run` writes one .npy per output and checks them against a reference.
fn cli_run() -> Result<(), Failed> {
    let case = lowering_dir().join("multi_out.pt2");
    let expected = case.with_extension("expected.npz");
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let status = tpuc_run(&case, &out, &expected).output()?;
    if !status.status.success() {
        return Err(String::from_utf8_lossy(&status.stderr).into_owned().into());
    }
    let stdout = String::from_utf8_lossy(&status.stdout);
    if !stdout.contains("all 4 outputs match") {
        return Err(format!("unexpected summary:\n{stdout}").into());
    }
    let outputs: Vec<HostTensor> = (0..4)
        .map(|i| read_npy(&out.join(format!("out{i}.npy"))))
        .collect::<anyhow::Result<_>>()
        .map_err(|e| format!("{e:#}"))?;
    let expected_outputs = read_npz(&expected).map_err(|e| format!("{e:#}"))?;
    compare_all(&outputs, &expected_outputs, 1e-5, 1e-5).map_err(|e| format!("{e:#}"))?;

    // With a cache of compiled executables: compiled and stored, then loaded, same outputs;
    // `off`: neither.
    let cache = dir.path().join("cache");
    for (setting, said) in [
        (cache.as_os_str(), "compile"),
        (cache.as_os_str(), "(from the cache)"),
        ("off".as_ref(), "compile"),
    ] {
        let run = tpuc_run(&case, &out, &expected)
            .arg("--cache-dir")
            .arg(setting)
            .output()?;
        let stderr = String::from_utf8_lossy(&run.stderr);
        let loaded = stderr.contains("(from the cache)");
        if !run.status.success() || !stderr.contains(said) || loaded != (said != "compile") {
            return Err(format!("--cache-dir {setting:?}: expected {said:?}:\n{stderr}").into());
        }
    }
    // `tpuc cache` shows it and the eager device's plans (one written here as the device
    // would), and empties both.
    std::fs::create_dir_all(cache.join("device-plans"))?;
    std::fs::write(cache.join("device-plans").join("0.plan"), b"a plan")?;
    for (args, said) in [
        (&[][..], "1 compiled executable(s)"),
        (&[][..], "1 eager device op plan(s)"),
        (&["--clear"][..], "removed 1 compiled executable(s)"),
        (&[][..], "0 compiled executable(s)"),
        (&[][..], "0 eager device op plan(s)"),
    ] {
        let shown = tpuc()
            .arg("cache")
            .arg("--cache-dir")
            .arg(&cache)
            .args(args)
            .output()?;
        let stdout = String::from_utf8_lossy(&shown.stdout);
        if !shown.status.success() || !stdout.contains(said) {
            return Err(format!("tpuc cache {args:?}: expected {said:?}, got:\n{stdout}").into());
        }
    }

    // A reference that does not match: exit status 1 and the mismatch named.
    let wrong = tpuc_run(&case, &out, &lowering_dir().join("mlp.expected.npz")).output()?;
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    if wrong.status.code() != Some(1) || !stderr.contains("reference") {
        return Err(format!("a mismatch must fail: {:?}\n{stderr}", wrong.status).into());
    }
    Ok(())
}

fn cli_plugins() -> Result<(), Failed> {
    let output = tpuc().arg("plugins").output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let wanted = [
        "cpu: ",
        "PJRT API:  0.",
        "stablehlo_current_version",
        "platform:  cpu",
        "devices:",
    ];
    match wanted.iter().find(|w| !stdout.contains(*w)) {
        Some(missing) if output.status.success() => {
            Err(format!("no `{missing}` in:\n{stdout}").into())
        }
        None if output.status.success() => Ok(()),
        _ => Err(String::from_utf8_lossy(&output.stderr).into_owned().into()),
    }
}

fn collectives(model: &Path, mesh: &str, plan: &str) -> Result<[usize; 3], Failed> {
    let dir = tempfile::tempdir()?;
    let flags = format!(
        "{} --xla_dump_to={} --xla_dump_hlo_as_text",
        std::env::var("XLA_FLAGS").unwrap_or_default(),
        dir.path().display()
    );
    let out = tpuc()
        .args([
            "run",
            "--cache-dir",
            "off",
            "--no-hoist",
            "--mesh",
            mesh,
            "--plan",
            plan,
        ])
        .arg(model)
        .arg("--input")
        .arg(model.with_extension("inputs.npz"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .env("XLA_FLAGS", flags)
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let mut counts = [0; 3];
    for entry in std::fs::read_dir(dir.path())? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with("after_optimizations.txt") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines().filter(|l| l.contains(" = ")) {
            for (i, op) in [" all-reduce(", " all-gather(", " reduce-scatter("]
                .iter()
                .enumerate()
            {
                counts[i] +=
                    usize::from(line.contains(op) || line.contains(&op.replace('(', "-start(")));
            }
        }
    }
    Ok(counts)
}

/// tp: one all-reduce after the attention's output projection and one after the MLP's down
/// projection, and nothing gathered; fsdp: each parameter gathered, nothing reduced (a forward
/// pass).
fn plans_bring_their_collectives() -> Result<(), Failed> {
    let llama = lowering_dir().join("llama_block.pt2");
    let [reduce, gather, scatter] = collectives(&llama, "tp=2", "tp")?;
    if (reduce, gather, scatter) != (2, 0, 0) {
        return Err(format!(
            "tp: {reduce} all-reduce, {gather} all-gather, {scatter} reduce-scatter; expected 2, 0, 0"
        )
        .into());
    }
    // Each of the block's 11 weights is split and gathered where it is used, once; the
    // batch-split result is gathered whole.
    let [reduce, gather, _] = collectives(&llama, "fsdp=2", "fsdp")?;
    if (reduce, gather) != (0, 12) {
        return Err(format!(
            "fsdp: {reduce} all-reduce, {gather} all-gather; expected 0 and 12 (one per weight, \
             one for the result)"
        )
        .into());
    }
    Ok(())
}

/// Plans and meshes given to the command that do not fit are refused, naming why.
fn plans_that_do_not_fit_are_refused() -> Result<(), Failed> {
    // Plan files: a spec of too many dimensions, an unknown axis, malformed (an uneven split
    // pads: numerics::uneven_batch).
    let dir = tempfile::tempdir()?;
    let mlp = lowering_dir().join("mlp.pt2");
    for (json, why) in [
        (
            r#"{"rules": {"fc1.bias": ["tp", null]}}"#,
            "the rule fc1.bias for weight fc1.bias: the spec gives 2 dimensions, but the tensor has 1",
        ),
        (
            r#"{"rules": {"fc1.weight": ["pp", null]}}"#,
            "over \"pp\", which the mesh does not have",
        ),
        (
            r#"{"rules": {"fc1.weight": "tp"}}"#,
            "a spec is a list with one entry per dimension",
        ),
        (r#"{"layers": {}}"#, "unknown or malformed entry \"layers\""),
        ("[1, 2", "not a JSON plan"),
    ] {
        let plan = dir.path().join("plan.json");
        std::fs::write(&plan, json)?;
        let out = tpuc()
            .args(["compile", "--mesh", "tp=3", "--plan"])
            .arg(&plan)
            .arg(&mlp)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains(why) {
            return Err(format!("{json}: expected `{why}`, got: {stderr}").into());
        }
    }
    // The flags themselves.
    for (args, why) in [
        (vec!["--mesh", "tp=2"], "--mesh needs --plan"),
        (vec!["--plan", "tp"], "--plan needs --mesh"),
        (vec!["--mesh", "tp", "--plan", "tp"], "expected NAME=SIZE"),
        (
            vec!["--mesh", "tp=2", "--plan", "zero"],
            "unknown plan \"zero\"",
        ),
    ] {
        let out = tpuc().arg("compile").args(&args).arg(&mlp).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains(why) {
            return Err(format!("{args:?}: expected `{why}`, got: {stderr}").into());
        }
    }
    let out = tpuc()
        .args([
            "run",
            "--devices",
            "2",
            "--mesh",
            "dp=2",
            "--plan",
            "dp",
            "--out",
        ])
        .arg(dir.path())
        .arg(&mlp)
        .output()?;
    if out.status.success()
        || !String::from_utf8_lossy(&out.stderr).contains("give one or the other")
    {
        return Err("--devices with --mesh is refused".into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let cache = tpuc_filetests::testdata::private_cache();
    let trials = vec![
        Trial::test("compile::emits_the_ir", cli_emits_the_ir),
        Trial::test("compile::several_programs", cli_compiles_several_programs),
        Trial::test(
            "compile::size_settings_are_checked",
            size_settings_are_checked,
        ),
        Trial::test(
            "dynamic::sizes_of_a_dynamic_program",
            sizes_of_a_dynamic_program,
        ),
        Trial::test("run::writes_and_checks_outputs", cli_run),
        Trial::test("run::repeats_runs", cli_repeats_runs),
        Trial::test("plugins::lists_the_cpu_plugin", cli_plugins),
        Trial::test(
            "sharded::plans_bring_their_collectives",
            plans_bring_their_collectives,
        ),
        Trial::test(
            "sharded::plans_that_do_not_fit_are_refused",
            plans_that_do_not_fit_are_refused,
        ),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    drop(cache);
    conclusion.exit();
}
