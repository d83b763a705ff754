// mimalloc for small blocks: the server makes and drops many small JSON values per call; under
// load it serves ~1.5x the calls per CPU second of the system allocator (benches/http_load.rs).
// Large blocks are mappings of their own (crates/memory/src/allocator.rs says why).
#[global_allocator]
static ALLOCATOR: cloud_harness_memory::Allocator = cloud_harness_memory::Allocator;

use clap::Parser;
use cloud_harness::cli::{self, Cli};
use std::process::ExitCode;

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // The configuration file becomes the variables everything reads, before any is read.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The run agent inside an executor: nothing of the server's set-up, not even its
    // configuration, happens in there.
    if args
        .get(1)
        .is_some_and(|a| a == cloud_harness_executor::agent::COMMAND)
    {
        let rest: Vec<String> = args[2..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return ExitCode::from(cloud_harness_executor::agent::main(&rest).clamp(0, 255) as u8);
    }
    // What starts a bubblewrap sandbox: nothing of the server's either.
    if args
        .get(1)
        .is_some_and(|a| a == cloud_harness_executor::launcher::COMMAND)
    {
        return ExitCode::from(cloud_harness_executor::launcher::main(&args[2..]) as u8);
    }
    // The unmount guard a daemon starts beside itself: it reads no configuration either (a
    // bad one must not keep the daemon's mounts unguarded).
    if args.len() == 2 && args[1] == cli::guard::COMMAND {
        return ExitCode::from(cli::guard::guard());
    }
    if let Err(err) = cloud_harness_control::config::init(&args) {
        eprintln!("error: {err}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(args);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // A client's bad request is its business: the SDK's per-request error lines
        // stay out of an operator's log unless asked for.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rmcp::service=error"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format {
        cli::LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        // One JSON object a line, with the fields of the spans it happened in (the request id
        // of an MCP call among them).
        cli::LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    match cli::run(cli) {
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
