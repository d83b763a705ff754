//! `cloud-harness cas …`

use clap::Subcommand;
use cloud_harness_error::{Error, Result};
use cloud_harness_provision::cache;
use cloud_harness_provision::remote::RemoteStore;
use cloud_harness_store::cas::{self, Digest, Limits, Store};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum CasCommand {
    /// A bundle's inventory (CycloneDX 1.5 JSON): its toolkit, commit and reachability, each
    /// skill and file with its SHA-256, size and mode. With `--file` or `--skill` instead:
    /// which bundles hold that file or skill, and which workspaces and imports they served.
    Inventory {
        /// The bundle's digest (as `workspace_open` shows it).
        #[arg(required_unless_present_any = ["file", "skill"], conflicts_with_all = ["file", "skill"])]
        bundle: Option<Digest>,
        /// A file's SHA-256.
        #[arg(long, conflicts_with = "skill")]
        file: Option<Digest>,
        /// A skill folder's name.
        #[arg(long)]
        skill: Option<String>,
        #[command(flatten)]
        home: super::control::HomeArg,
    },
    /// Import a directory as a tree; prints its digest.
    Import {
        dir: PathBuf,
        /// Also record a garbage-collection root of this name for the tree.
        #[arg(long, value_name = "NAME")]
        root: Option<String>,
    },
    /// Write a tree out into a new directory.
    Materialize { digest: Digest, dest: PathBuf },
    /// Re-hash every object and check every reference; exits 1 on any problem.
    Verify {
        #[arg(long)]
        json: bool,
    },
    /// Remove objects no root reaches, older than the grace period.
    Gc {
        /// Seconds an unreferenced object is kept after it was written or last reused.
        #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
        grace: u64,
        /// Collect the fleet's store of record (`TOOLKIT_STORE_URL`) instead of the local
        /// store: one collector at a time, roots are the bundle-index records.
        #[arg(long)]
        remote: bool,
    },
}

pub fn run(store: &Store, cmd: CasCommand) -> Result<u8> {
    match cmd {
        CasCommand::Inventory {
            bundle,
            file,
            skill,
            home,
        } => {
            use cloud_harness_provision::inventory::{self, Needle};
            let found = match (bundle, file, skill) {
                (Some(bundle), _, _) => {
                    let index = cloud_harness_provision::index::BundleIndex::open(store);
                    inventory::of(
                        store,
                        &inventory::record(&index, &bundle)?,
                        &home.db()?,
                        &cloud_harness_control::signatures::policy::Policy::from_env()?,
                    )?
                }
                (None, Some(file), _) => {
                    serde_json::json!(inventory::search(store, &home.db()?, &Needle::File(file))?)
                }
                (None, None, Some(skill)) => {
                    serde_json::json!(inventory::search(
                        store,
                        &home.db()?,
                        &Needle::Skill(skill)
                    )?)
                }
                (None, None, None) => unreachable!("clap requires one"),
            };
            super::control::print(found);
            Ok(0)
        }
        CasCommand::Import { dir, root } => {
            let imported = store.import_dir(&dir, &Limits::default())?;
            if let Some(name) = root {
                store.set_root(&name, &imported.digest)?;
            }
            println!(
                "{} {} files {} bytes",
                imported.digest, imported.files, imported.bytes
            );
            Ok(0)
        }
        CasCommand::Materialize { digest, dest } => {
            cas::materialize(store, &digest, &dest)?;
            println!("{}", dest.display());
            Ok(0)
        }
        CasCommand::Verify { json } => {
            let bar = super::progress::Bar::new("cas verify");
            let report = store.verify_watched(&bar)?;
            bar.finish(format!("{} objects hashed", report.blobs + report.trees));
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report)
                        .map_err(|e| Error::internal(e.to_string()))?
                );
            } else {
                println!(
                    "{} blobs ({} bytes), {} trees, {} problems",
                    report.blobs,
                    report.bytes,
                    report.trees,
                    report.problems.len()
                );
                for p in &report.problems {
                    println!("{:?} {}: {}", p.problem, p.object, p.detail);
                }
            }
            Ok(if report.problems.is_empty() { 0 } else { 1 })
        }
        CasCommand::Gc {
            grace,
            remote: true,
        } => {
            let remote = RemoteStore::from_env()?.ok_or_else(|| {
                Error::invalid(
                    "--remote collects the store of record, and TOOLKIT_STORE_URL names none",
                )
            })?;
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            let host = host.trim();
            let holder = format!("{host}/{}", std::process::id());
            let report = remote.gc(Duration::from_secs(grace), &holder)?;
            println!(
                "{}: {} records; kept {} objects, {} younger than the grace period; removed {} objects ({} bytes)",
                remote.url(),
                report.records,
                report.kept,
                report.young,
                report.removed,
                report.removed_bytes
            );
            for skipped in &report.skipped {
                println!(
                    "skipped {}: {} (what it names was kept)",
                    skipped.record, skipped.reason
                );
            }
            Ok(0)
        }
        CasCommand::Gc { grace, .. } => {
            let max = cache::max_bytes_from_env()?;
            let bar = super::progress::Bar::new("cas gc");
            let trim = cache::collect_watched(store, Duration::from_secs(grace), max, &bar)?;
            bar.finish(format!("{} objects removed", trim.removed));
            for bundle in &trim.forgotten {
                println!("forgot {bundle} (least recently used)");
            }
            let size = match (trim.bytes_after, max) {
                (Some(after), Some(max)) => {
                    format!("; the store's objects now take {after} bytes (at most {max})")
                }
                _ => String::new(),
            };
            println!(
                "removed {} objects ({} bytes) and {} temp files{size}",
                trim.removed, trim.removed_bytes, trim.removed_temp,
            );
            Ok(0)
        }
    }
}
