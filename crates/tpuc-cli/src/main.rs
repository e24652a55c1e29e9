use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(tpuc_cli::cli::main(std::env::args_os(), &[]))
}
