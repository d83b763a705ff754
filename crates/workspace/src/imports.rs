//! Import jobs: acquiring a toolkit into the store in the background — queued, running
//! (fetching, staging), done, failed or cancelled — with live progress (phase and bytes) and
//! cancel. Two run at a time; jobs are rows of the state database, so a queued job outlives a
//! restart (a running one is marked failed by it).

use crate::Workspaces;
use cloud_harness_control::params;
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::observe::Observer;
use cloud_harness_skills::spec;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const WORKERS: usize = 2;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: String,
    pub toolkit: Value,
    /// `queued`, `running`, `done`, `failed` or `cancelled`.
    pub state: String,
    /// While running: `fetching`, `staging`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// While running: the bytes fetched so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub actor: String,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// When done: the acquisition (commit, bundle, mode, skills, bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

pub struct Imports {
    workspaces: Arc<Workspaces>,
    /// The observers of running jobs, by id.
    running: Mutex<HashMap<String, Arc<Observer>>>,
    wake: Condvar,
    queued: Mutex<u64>,
}

fn db_of(i: &Imports) -> &Db {
    i.workspaces.db()
}

impl Imports {
    /// The jobs of `workspaces`' database, with their workers started. Jobs a previous server
    /// left running are failed; queued ones run.
    pub fn start(workspaces: Arc<Workspaces>) -> Result<Arc<Imports>> {
        workspaces.db().write(|tx| {
            tx.execute(
                "UPDATE imports SET state = 'failed', finished_at = $1, error = $2
                 WHERE state = 'running' AND (runner = $3 OR runner = '')",
                params![
                    state::now_ms(),
                    json!({"code": "INTERNAL", "message": "the server stopped during this import"})
                        .to_string(),
                    workspaces.db().runner()
                ],
            )
            .map_err(state::internal)?;
            Ok(())
        })?;
        let imports = Arc::new(Imports {
            workspaces,
            running: Mutex::default(),
            wake: Condvar::new(),
            queued: Mutex::new(0),
        });
        for _ in 0..WORKERS {
            let me = imports.clone();
            std::thread::spawn(move || me.work());
        }
        Ok(imports)
    }

    /// Queues the import of `spec` (a preset or a git toolkit, checked as `workspace_open`
    /// checks it).
    pub fn submit(&self, spec: Value, actor: &str) -> Result<Job> {
        cloud_harness_control::limits::quotas().import(actor)?;
        let parsed = toolkit::spec_from_value(spec.clone())?;
        if matches!(parsed, ToolkitSpec::Set(_)) {
            return Err(Error::field(
                Code::InvalidArgument,
                "kind",
                "an import takes one toolkit, a preset or a git toolkit",
            ));
        }
        let registry = cloud_harness_curation::registry::load(db_of(self))?;
        if let Err(e) = parsed.resolve_in(self.workspaces.hosts(), &registry) {
            cloud_harness_control::audit::refusal(db_of(self), actor, "import", &e);
            return Err(e);
        }
        let id = state::new_id("imp");
        let now = state::now_ms();
        db_of(self).write(|tx| {
            tx.execute(
                "INSERT INTO imports (id, spec, state, actor, created_at) VALUES ($1, $2, 'queued', $3, $4)",
                params![id, spec.to_string(), actor, now],
            )
            .map_err(state::internal)?;
            cloud_harness_control::audit::record(tx, actor, "import.submit", &format!("import:{id}"), &json!({ "toolkit": spec }))
        })?;
        *self.queued.lock().expect("queue lock") += 1;
        self.wake.notify_one();
        self.get(&id)
    }

    fn work(&self) {
        loop {
            match self.take() {
                Ok(Some((id, spec))) => self.run(&id, spec),
                Ok(None) => {
                    // An import opened a workspace: what others freed of it (memory::idle).
                    cloud_harness_memory::idle::at_idle();
                    let queued = self.queued.lock().expect("queue lock");
                    // Woken by a submit, or every second (jobs queued by another process).
                    let _ = self.wake.wait_timeout(queued, Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot take an import job");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// The oldest queued job, now running.
    fn take(&self) -> Result<Option<(String, Value)>> {
        db_of(self).write(|tx| {
            let row: Option<(String, String)> = tx
                .query_row(
                    "UPDATE imports SET state = 'running', started_at = $1, runner = $2
                     WHERE id = (SELECT id FROM imports WHERE state = 'queued' ORDER BY created_at, id LIMIT 1)
                     RETURNING id, spec",
                    params![state::now_ms(), db_of(self).runner()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(state::internal)?;
            Ok(row.map(|(id, spec)| (id, serde_json::from_str(&spec).unwrap_or(Value::Null))))
        })
    }

    /// The skills of an imported bundle that break the Agent Skills specification, each with
    /// the rules it breaks (what the library and every open will say of them).
    fn problems(&self, a: &cloud_harness_provision::Acquired) -> Value {
        let source = cloud_harness_provision::bundle_source(
            self.workspaces.store(),
            &cloud_harness_skills::discovery::SkillCache::default(),
            cloud_harness_skills::resolver::Tier::Owner,
            &a.record.instance_id,
            &a.record.key.url,
            &a.record.key.commit,
            a.record.bundle,
            Default::default(),
        );
        let Ok(source) = source else {
            return Value::Null;
        };
        source
            .discovery
            .skills
            .iter()
            .filter(|f| !f.info.problems.is_empty())
            .map(|f| (f.name.to_string(), json!(spec::rules(&f.info.problems))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    fn run(&self, id: &str, spec: Value) {
        let observer = Arc::new(Observer::default());
        self.running
            .lock()
            .expect("running lock")
            .insert(id.to_owned(), observer.clone());
        let actor = format!("import:{id}");
        let started = Instant::now();
        let resolved = toolkit::spec_from_value(spec).and_then(|s| {
            let registry = cloud_harness_curation::registry::load(db_of(self))?;
            s.resolve_in(self.workspaces.hosts(), &registry)
        });
        cloud_harness_error::failpoint::point("import.running");
        let outcome = match &resolved {
            Ok(t) => {
                let outcome = self.workspaces.provisioner().acquire_observed(t, &observer);
                cloud_harness_error::failpoint::point("import.acquired");
                cloud_harness_provision::acquisitions::record(
                    db_of(self),
                    t,
                    &outcome,
                    started.elapsed().as_millis() as u64,
                    &actor,
                    "import",
                    Some(id),
                );
                outcome
            }
            Err(e) => Err(e.clone()),
        };
        let (st, result, error) = match &outcome {
            Ok(a) => (
                "done",
                Some(
                    json!({ "commit": a.record.key.commit, "bundle": a.record.bundle, "mode": a.mode, "skills": a.record.skills, "bytes": a.bytes, "warm": a.warm, "instanceId": a.record.instance_id, "problems": self.problems(a) }),
                ),
                None,
            ),
            Err(e) if e.code == Code::Cancelled => (
                "cancelled",
                None,
                Some(json!({ "code": e.code, "message": e.message })),
            ),
            Err(e) => (
                "failed",
                None,
                Some(
                    json!({ "code": e.code, "status": e.status, "message": e.message, "details": e.details }),
                ),
            ),
        };
        if let Err(e) = &outcome {
            cloud_harness_control::audit::refusal(db_of(self), &actor, "import", e);
        }
        let written = db_of(self).write(|tx| {
            tx.execute(
                "UPDATE imports SET state = $1, finished_at = $2, result = $3, error = $4 WHERE id = $5",
                params![st, state::now_ms(), result.map(|r| r.to_string()), error.map(|e| e.to_string()), id],
            )
            .map_err(state::internal)?;
            Ok(())
        });
        if let Err(e) = written {
            tracing::error!(job = id, error = %e, "cannot record the end of an import");
        }
        self.running.lock().expect("running lock").remove(id);
    }

    fn row(r: &state::Row) -> state::DbResult<Job> {
        let parse = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
        let spec: String = r.get("spec")?;
        Ok(Job {
            id: r.get("id")?,
            toolkit: serde_json::from_str(&spec).unwrap_or(Value::Null),
            state: r.get("state")?,
            phase: None,
            bytes: None,
            actor: r.get("actor")?,
            created_at: r.get("created_at")?,
            started_at: r.get("started_at")?,
            finished_at: r.get("finished_at")?,
            result: parse(r.get("result")?),
            error: parse(r.get("error")?),
        })
    }

    /// A job with its live progress while it runs.
    fn live(&self, mut job: Job) -> Job {
        if job.state == "running" {
            if let Some(o) = self.running.lock().expect("running lock").get(&job.id) {
                job.phase = Some(o.phase().to_owned());
                job.bytes = Some(o.bytes());
            }
        }
        job
    }

    pub fn get(&self, id: &str) -> Result<Job> {
        let job = db_of(self)
            .with(|c| {
                c.prepare_cached("SELECT * FROM imports WHERE id = $1")?
                    .query_row(params![id], Imports::row)
                    .optional()
            })?
            .ok_or_else(|| {
                Error::field(
                    Code::NotFound,
                    "id",
                    format!(
                        "no import job {:?}",
                        cloud_harness_control::input::shown(id)
                    ),
                )
            })?;
        Ok(self.live(job))
    }

    /// Every job, newest first.
    pub fn list(&self, limit: usize) -> Result<Vec<Job>> {
        let jobs = db_of(self).with(|c| {
            c.prepare_cached("SELECT * FROM imports ORDER BY created_at DESC, id DESC LIMIT $1")?
                .query_map(params![limit as i64], Imports::row)?
                .collect::<state::DbResult<Vec<_>>>()
        })?;
        Ok(jobs.into_iter().map(|j| self.live(j)).collect())
    }

    /// Cancels a queued job at once, a running one at its next check; CONFLICT for one that
    /// ended.
    pub fn cancel(&self, id: &str, actor: &str) -> Result<Job> {
        let job = self.get(id)?;
        match job.state.as_str() {
            "queued" => {
                db_of(self).write(|tx| {
                    tx.execute(
                        "UPDATE imports SET state = 'cancelled', finished_at = $1, error = $2 WHERE id = $3 AND state = 'queued'",
                        params![state::now_ms(), json!({"code": "CANCELLED", "message": "cancelled before it ran"}).to_string(), id],
                    )
                    .map_err(state::internal)?;
                    Ok(())
                })?;
            }
            "running" => {
                if let Some(o) = self.running.lock().expect("running lock").get(id) {
                    o.cancel();
                }
            }
            other => {
                return Err(Error::field(
                    Code::Conflict,
                    "id",
                    format!("import {id} is {other}: there is nothing to cancel"),
                ));
            }
        }
        cloud_harness_control::audit::event(
            db_of(self),
            actor,
            "import.cancel",
            &format!("import:{id}"),
            &json!({}),
        )?;
        self.get(id)
    }
}
