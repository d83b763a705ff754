//! `skills_run`: a script of an approved skill, run in the workspace's executor.
//!
//! The bytes that run are the approved ones: the skill's digest is taken from the served
//! generation once, checked against the operator's approvals, and the script runs from a
//! verified copy of exactly that tree (`/opt/cloud-harness/.by-digest/<hex>/`), which no live
//! change, no executor and no later generation can alter. A script that is a link leaving
//! its skill does not run.

use super::served::Workspace;
use cloud_harness_control::skill_usage::Source;
use cloud_harness_curation::decisions;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_executor::runner::{self, Outcome};
use cloud_harness_executor::{self as executor, Command, RunLimits};
use cloud_harness_store::cas::{self, Digest};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Counts a run as running while it lives; its end is the workspace's last use (its idle
/// time starts there, not at the call that asked for it).
struct Running<'a>(&'a Workspace);

impl<'a> Running<'a> {
    fn new(ws: &'a Workspace) -> Running<'a> {
        ws.running.fetch_add(1, Ordering::SeqCst);
        Running(ws)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.idle.touch();
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What `skills_run` is asked.
#[derive(Debug)]
pub struct RunRequest {
    pub skill: String,
    pub script: String,
    pub args: Vec<String>,
    pub timeout: Duration,
}

/// Workspace work (file system, engine calls) off the async threads, in the caller's span (an
/// MCP call's request id stays on what it logs) and within the share of the principal the
/// task acts for ([`cloud_harness_control::limits::blocking`]); a task that fails to finish is
/// an internal error.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    cloud_harness_control::limits::blocking(work)
        .await
        .and_then(|r| r)
}

impl Workspace {
    /// That the served skill has the file `script` (as the mount shows it).
    fn served_script(&self, skill: &str, script: &str) -> Result<()> {
        let parts = super::read::check_skill_path(script, "script")?;
        let path: Vec<&str> = std::iter::once(skill).chain(parts).collect();
        let missing = || {
            Error::new(
                Code::NotFound,
                format!("script: skill `{skill}` has no script {script:?}"),
            )
            .with_details(json!({ "field": "script" }))
        };
        match self.merged.read_path(&path, 0, 0) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(missing()),
            Err(nix::errno::Errno::EISDIR) => Err(Error::new(
                Code::InvalidArgument,
                format!("script: {script:?} is a folder, not a file"),
            )
            .with_details(json!({ "field": "script" }))),
            Err(e) => Err(Error::internal(format!("reading {skill}/{script}: {e}"))),
        }
    }

    /// The verified copy of the skill tree `digest`, made once per workspace.
    fn approved_copy(&self, digest: &Digest) -> Result<PathBuf> {
        let dir = self.places.mounts.join(executor::BY_DIGEST);
        let copy = dir.join(digest.hex());
        if copy.is_dir() {
            return Ok(copy);
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // Copies appear whole (renamed into place): when a concurrent run got there first,
        // its copy is the same tree.
        match cas::materialize(&self.store, digest, &copy) {
            Err(_) if copy.is_dir() => Ok(copy),
            Err(e) => Err(e),
            Ok(()) => Ok(copy),
        }
    }

    /// The command that runs `script` of the approved skill tree `digest` from its verified
    /// copy (`run_as`: the script's path as the executor sees it). A script that is a link
    /// leaving its skill, or not a file, does not run.
    fn approved_script(
        &self,
        digest: &Digest,
        skill: &str,
        script: &str,
        run_as: &str,
    ) -> Result<Vec<String>> {
        let copy = self.approved_copy(digest)?;
        let host_script = copy.join(script);
        let script_error = |code: Code, what: String| {
            Error::new(code, format!("script: {what}")).with_details(json!({ "field": "script" }))
        };
        let resolved = std::fs::canonicalize(&host_script).map_err(|_| {
            script_error(
                Code::NotFound,
                format!("skill `{skill}` has no script {script:?}"),
            )
        })?;
        let root = std::fs::canonicalize(&copy).map_err(|e| Error::io(&copy, e))?;
        if !resolved.starts_with(&root) {
            return Err(script_error(
                Code::Forbidden,
                format!(
                    "{script:?} is a link that leaves the skill; only the approved skill's own files run"
                ),
            ));
        }
        if !resolved.is_file() {
            return Err(script_error(
                Code::InvalidArgument,
                format!("{script:?} is not a file"),
            ));
        }
        runner::command_for(&host_script, run_as)
    }

    /// Runs a script of a served, approved skill in the executor.
    /// `actor` is who asked (the audit log names them when the run is refused).
    pub async fn run(
        self: Arc<Self>,
        home: &Path,
        actor: &str,
        request: RunRequest,
        cancel: CancellationToken,
        progress: impl Fn(Duration, u64),
    ) -> Result<serde_json::Value> {
        let kind = self.executor.as_ref().map(|e| e.spec.kind.as_str());
        let started = std::time::Instant::now();
        // The version a run uses is the one it started with.
        let origin = self.origin(&request.skill);
        let (skill, script) = (request.skill.clone(), request.script.clone());
        let ran = self
            .clone()
            .run_script(home, actor, request, cancel, progress)
            .await;
        // A run is a use once its script started (a refusal or an error before is not); it
        // failed when the script did not exit with 0, unless the caller cancelled it.
        if let (Some(origin), Ok(outcome)) = (origin, &ran) {
            let failed = outcome["exitCode"].as_i64() != Some(0) && outcome["cancelled"] != true;
            let script = super::read::check_skill_path(&script, "script").map(|p| p.join("/"));
            let file = script.unwrap_or_default();
            let took = started.elapsed();
            self.used_from(&origin, Source::Run, actor, &skill, &file, failed, took);
        }
        if let Some(kind) = kind {
            let result = match &ran {
                Ok(_) => "ok",
                Err(e) => e.code.as_str(),
            };
            cloud_harness_control::metrics::run(kind, result);
        }
        ran
    }

    async fn run_script(
        self: Arc<Self>,
        home: &Path,
        actor: &str,
        request: RunRequest,
        cancel: CancellationToken,
        progress: impl Fn(Duration, u64),
    ) -> Result<serde_json::Value> {
        let executor = self.executor.as_ref().ok_or_else(executor::missing)?;
        let digest = self.skill(&request.skill)?;
        // A script the skill does not have is NOT_FOUND whether or not the skill is approved.
        self.served_script(&request.skill, &request.script)?;
        let skill_dir = executor.paths().by_digest(&digest.hex());
        // The approval, the verified copy and the script's checks: one trip to the blocking
        // pool (each trip is a wake-up of another thread, a run's largest cost after its
        // process).
        let prepared = {
            let (db, home, ws) = (self.db.clone(), home.to_owned(), self.clone());
            let (skill, script, actor, run_as) = (
                request.skill.clone(),
                request.script.clone(),
                actor.to_owned(),
                format!("{skill_dir}/{}", request.script),
            );
            blocking(move || {
                if !decisions::in_force(&db, &home)?.is_approved(&digest) {
                    decisions::refused_run(&db, &digest, &skill, &script, &ws.id, &actor)?;
                    return Ok(None);
                }
                ws.approved_script(&digest, &skill, &script, &run_as)
                    .map(Some)
            })
            .await?
        };
        let Some(mut argv) = prepared else {
            let file = cloud_harness_control::operator::Operator::path(home);
            return Err(Error::new(
                Code::Forbidden,
                format!(
                    "skill `{}` ({digest}) is not approved to run scripts; an operator approves it with `cloud-harness approve add {digest}`, POST /api/v1/approvals, or by adding it to approvedSkills in {}",
                    request.skill,
                    file.display()
                ),
            )
            .with_details(json!({
                "skill": request.skill,
                "digest": digest,
                "approve": { "cli": format!("cloud-harness approve add {digest}"), "api": "POST /api/v1/approvals", "file": file, "approvedSkills": [digest] },
            })));
        };
        argv.extend(request.args.iter().cloned());
        let limits = cloud_harness_control::limits::quotas().limits;
        let process = executor
            .spawn(&Command {
                argv: argv.clone(),
                env: vec![
                    ("CLOUD_HARNESS_SKILL".to_owned(), request.skill.clone()),
                    ("CLOUD_HARNESS_SKILL_DIR".to_owned(), skill_dir.clone()),
                ],
                limits: Some(RunLimits::current()),
            })
            .await?;
        // Closing the workspace cancels its runs too, and waits for them to end.
        let _running = Running::new(&self);
        let token = self.runs.child_token();
        let forward = {
            let token = token.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                token.cancel();
            })
        };
        let cap = usize::try_from(limits.run_output).unwrap_or(usize::MAX);
        let outcome: Outcome =
            runner::supervise(process, argv, request.timeout, cap, token, progress).await;
        forward.abort();
        let mut value = serde_json::to_value(&outcome).expect("outcomes serialize");
        value["skill"] = json!(request.skill);
        value["script"] = json!(request.script);
        value["digest"] = json!(digest);
        value["skillDir"] = json!(skill_dir);
        value["executor"] = json!(executor.kind());
        Ok(value)
    }
}
