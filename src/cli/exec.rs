//! `cloud-harness exec WORKSPACE -- COMMAND…`: runs a command in a workspace's executor, as
//! a person or a platform would (cwd `/workspace`, standard streams passed through, the
//! command's exit status returned). It reads the workspace's record under the server's home,
//! so it works while `serve` runs, and reaches the same container or sandbox layout.

use clap::Args;
use cloud_harness_error::{Error, Result};
use cloud_harness_executor::{Executor, Places};
use cloud_harness_workspace::Record;
use std::path::PathBuf;

/// The exit status when the harness itself fails (as `docker exec` does).
pub const HARNESS_FAILED: u8 = 125;

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The workspace handle `workspace_open` returned (ws_…).
    pub workspace: String,
    /// Where workspaces live (the server's home).
    #[arg(long, env = "CLOUD_HARNESS_HOME", value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

pub fn run(args: &ExecArgs) -> Result<u8> {
    match exec(args) {
        Ok(status) => Ok(status.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(HARNESS_FAILED)
        }
    }
}

fn exec(args: &ExecArgs) -> Result<i32> {
    let home = args
        .home
        .clone()
        .unwrap_or_else(cloud_harness_control::home::default_home);
    let (dir, record) = Record::find(&home, &args.workspace)?;
    let spec = record
        .executor
        .ok_or_else(cloud_harness_executor::missing)?;
    let places = Places::of(&dir);
    if !cloud_harness_workspace::is_mounted(&places) {
        eprintln!(
            "warning: the skills of {} are not mounted (is `cloud-harness serve` running?)",
            args.workspace
        );
    }
    // A bubblewrap sandbox with egress gets its proxy here, with the policy `serve` has.
    let policy = cloud_harness_provision::egress::EgressPolicy::from_env(
        cloud_harness_control::hosts::HostPolicy::new(
            &cloud_harness_executor::Settings::from_env()?.allowed_hosts,
            "",
        )?,
    )?;
    Executor::attach(spec, places, &args.workspace)
        .with_egress(policy)
        .run_attached(&args.command)
        .map_err(|e| Error::new(e.code, e.message))
}
