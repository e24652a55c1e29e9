use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tpuc_hlo::{EmitFormat, LowerOptions, Precision, WeightsMode};

/// tpuc compiles PyTorch programs (torch.export archives) into StableHLO.
#[derive(Parser)]
#[command(name = "tpuc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    /// MLIR text, StableHLO ops in generic form, with source locations.
    Text,
    /// MLIR bytecode.
    Bytecode,
}

#[derive(Clone, Copy, ValueEnum)]
enum Weights {
    /// Parameters, buffers and constants become the leading arguments of `main`, in the
    /// order of the program's signature; the runtime passes them in.
    Args,
    /// Weights become inline constants: a self-contained module (large for big models).
    Inline,
}

#[derive(Clone, Copy, ValueEnum)]
enum MatmulPrecision {
    /// Full f32 precision, as torch computes on CPU.
    Highest,
    /// Backend's choice between DEFAULT and HIGHEST (e.g. bf16x3 on TPU).
    High,
    /// The backend's default (may use TF32 or bf16 for f32 matmuls on accelerators).
    Default,
}

#[derive(Clone, Copy, ValueEnum)]
enum FxWeights {
    /// Inside the .fx file.
    Inline,
    /// In OUT.weights beside it, each weight 64-byte aligned for memory mapping.
    SideFile,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a torch.export archive (.pt2) or a tpuc .fx file to StableHLO.
    Compile {
        /// Input program: a .pt2 archive from torch.export.save, or a .fx file.
        input: PathBuf,
        /// Output file; `-` writes to standard output.
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Emit::Text)]
        emit: Emit,
        /// How weights reach the module.
        #[arg(long, value_enum, default_value_t = Weights::Args)]
        weights: Weights,
        /// Precision of f32 matmuls and convolutions.
        #[arg(long, value_enum, default_value_t = MatmulPrecision::Highest)]
        matmul_precision: MatmulPrecision,
        /// Print node/op counts and the time of each stage to standard error.
        #[arg(long)]
        stats: bool,
    },
    /// Convert a .pt2 archive to tpuc's .fx interchange (or re-write a .fx file).
    Convert {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Where the weights go.
        #[arg(long, value_enum, default_value_t = FxWeights::Inline)]
        weights: FxWeights,
    },
    /// List the ATen ops tpuc lowers.
    Ops,
}

fn run() -> Result<()> {
    match Cli::parse().command {
        Command::Compile {
            input,
            output,
            emit,
            weights,
            matmul_precision,
            stats,
        } => {
            let opts = LowerOptions {
                weights: match weights {
                    Weights::Args => WeightsMode::Args,
                    Weights::Inline => WeightsMode::Inline,
                },
                precision: match matmul_precision {
                    MatmulPrecision::Highest => Precision::Highest,
                    MatmulPrecision::High => Precision::High,
                    MatmulPrecision::Default => Precision::Default,
                },
            };
            let format = match emit {
                Emit::Text => EmitFormat::Text,
                Emit::Bytecode => EmitFormat::Bytecode,
            };
            if matches!(emit, Emit::Bytecode) && output.as_os_str() == "-" && is_terminal() {
                bail!("refusing to write bytecode to a terminal; pass -o FILE");
            }
            let c = tpuc_cli::compile_file(&input, &opts, format)?;
            if output.as_os_str() == "-" {
                use std::io::Write;
                std::io::stdout()
                    .write_all(&c.output)
                    .context("writing to standard output")?;
            } else {
                std::fs::write(&output, &c.output)
                    .with_context(|| format!("writing {}", output.display()))?;
            }
            if stats {
                eprintln!(
                    "{} nodes -> {} StableHLO ops; read {:.1} ms, lower {:.1} ms, emit {:.1} ms",
                    c.nodes,
                    c.lowered.module.main.ops.len(),
                    c.read.as_secs_f64() * 1e3,
                    c.lower.as_secs_f64() * 1e3,
                    c.emit.as_secs_f64() * 1e3
                );
            }
        }
        Command::Convert {
            input,
            output,
            weights,
        } => {
            let program = tpuc_fx::read_program(&input)?;
            let storage = match weights {
                FxWeights::Inline => tpuc_fx::fxfile::WeightStorage::Inline,
                FxWeights::SideFile => tpuc_fx::fxfile::WeightStorage::SideFile,
            };
            tpuc_fx::fxfile::write_fx(&program, &output, storage)?;
        }
        Command::Ops => {
            for op in tpuc_hlo::lower::supported_ops() {
                println!("{op}");
            }
        }
    }
    Ok(())
}

fn is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal()
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
