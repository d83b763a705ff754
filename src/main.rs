// mimalloc: the server makes and drops many small JSON values per call; under load it serves
// ~1.5x the calls per CPU second of the system allocator (benches/http_load.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use cloud_harness::cli::{self, Cli};
use std::process::ExitCode;

fn main() -> ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // A client's bad request is its business: the SDK's per-request error lines
                // stay out of an operator's log unless asked for.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rmcp::service=error")),
        )
        .init();
    match cli::run(Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err}");
            if !err.details.is_null() {
                eprintln!("details: {}", err.details);
            }
            ExitCode::from(1)
        }
    }
}
