//! The audit log: every operator action and security event, append-only (the database refuses
//! updates and deletes of it), each with its actor, time and subject; also written as a
//! structured log line (target `audit`).

use crate::limits::bucket::Buckets;
use crate::params;
use crate::state::{self, Db};
use cloud_harness_error::Result;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub seq: i64,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    pub actor: String,
    pub action: String,
    pub subject: String,
    pub details: Value,
}

/// Appends an entry within the transaction `tx` that makes the change it describes, so the
/// change and its entry are stored together or not at all.
pub fn record(
    tx: &state::Conn,
    actor: &str,
    action: &str,
    subject: &str,
    details: &Value,
) -> Result<()> {
    tx.execute(
        "INSERT INTO audit (at, actor, action, subject, details) VALUES ($1, $2, $3, $4, $5)",
        params![state::now_ms(), actor, action, subject, details.to_string()],
    )
    .map_err(state::internal)?;
    tracing::info!(target: "audit", actor, action, subject, details = %details);
    // A change of `subject` (an approval, say) makes its next refusal news again.
    if !action.ends_with(".refused") {
        if let Some(throttle) = THROTTLE.get() {
            throttle.rearm(subject);
        }
    }
    Ok(())
}

/// An entry on its own (a refusal: nothing else changes).
pub fn event(db: &Db, actor: &str, action: &str, subject: &str, details: &Value) -> Result<()> {
    db.write(|tx| record(tx, actor, action, subject, details))
}

/// What a listing keeps: entries whose fields equal those given.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub actor: Option<String>,
    pub action: Option<String>,
    pub subject: Option<String>,
}

/// Entries newest first, those before `before` (a `seq`), at most `limit`; with the `seq` to
/// continue from when there are more.
pub fn list(
    db: &Db,
    filter: &Filter,
    before: Option<i64>,
    limit: usize,
) -> Result<(Vec<Entry>, Option<i64>)> {
    let mut entries = db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT seq, at, actor, action, subject, details FROM audit
             WHERE (CAST($1 AS TEXT) IS NULL OR actor = $1)
               AND (CAST($2 AS TEXT) IS NULL OR action = $2)
               AND (CAST($3 AS TEXT) IS NULL OR subject = $3)
               AND (CAST($4 AS BIGINT) IS NULL OR seq < $4)
             ORDER BY seq DESC LIMIT $5",
        )?;
        let rows = q.query_map(
            params![
                filter.actor,
                filter.action,
                filter.subject,
                before,
                (limit + 1) as i64
            ],
            |r| {
                let details: String = r.get(5)?;
                Ok(Entry {
                    seq: r.get(0)?,
                    at: r.get(1)?,
                    actor: r.get(2)?,
                    action: r.get(3)?,
                    subject: r.get(4)?,
                    details: serde_json::from_str(&details).unwrap_or(Value::Null),
                })
            },
        )?;
        rows.collect::<state::DbResult<Vec<Entry>>>()
    })?;
    let more = entries.len() > limit;
    entries.truncate(limit);
    let next = more.then(|| entries.last().map(|e| e.seq)).flatten();
    Ok((entries, next))
}

/// Rows a caller's refused requests may add: the same refusal (actor, action, subject) at
/// most once a minute, and at most [`REFUSALS_PER_HOUR`] rows of refusals per actor an hour.
/// A refused request replayed in a loop therefore writes a row a minute, not a row a request;
/// the row says how many it stands for (`repeated`), and the log has every one.
pub(crate) const REFUSALS_PER_HOUR: u64 = 120;
const SAME_REFUSAL_EVERY: Duration = Duration::from_secs(60);
/// An operator's reads of another principal's workspace: one row per actor, workspace and
/// action every ten minutes.
const ACCESS_EVERY: Duration = Duration::from_secs(600);
/// Keys remembered before the oldest are forgotten.
const REMEMBERED: usize = 10_000;

struct Throttle {
    /// By key: when a row was last written, and the refusals since that wrote none.
    last: Mutex<HashMap<String, (Instant, u64)>>,
    per_actor: Buckets,
}

static THROTTLE: OnceLock<Throttle> = OnceLock::new();

fn throttle() -> &'static Throttle {
    THROTTLE.get_or_init(|| Throttle {
        last: Mutex::default(),
        per_actor: Buckets::new(REFUSALS_PER_HOUR as f64 / 3600.0, REFUSALS_PER_HOUR as f64),
    })
}

impl Throttle {
    /// Forgets the refusals of `subject` seen lately: the next is written.
    fn rearm(&self, subject: &str) {
        let tail = format!("\n{subject}");
        let mut last = self.last.lock().expect("audit throttle lock");
        last.retain(|key, _| !(key.starts_with("refusal\n") && key.ends_with(&tail)));
    }

    /// Whether a row for `key` may be written now, with the number of earlier events it
    /// stands for; `None`: counted, not written. `shared`: the row also takes one of the
    /// actor's hourly share.
    fn admit(&self, actor: &str, key: String, every: Duration, shared: bool) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().expect("audit throttle lock");
        if last.len() >= REMEMBERED && !last.contains_key(&key) {
            last.retain(|_, (at, _)| now.duration_since(*at) < ACCESS_EVERY);
            if last.len() >= REMEMBERED {
                last.clear();
            }
        }
        match last.get_mut(&key) {
            Some((at, skipped)) if now.duration_since(*at) < every => {
                *skipped += 1;
                None
            }
            _ if shared && self.per_actor.take(actor).is_err() => {
                tracing::warn!(target: "audit", actor, key = %key, "refusals past the audit log's share for this caller: logged here only");
                None
            }
            Some((at, skipped)) => {
                let repeated = *skipped;
                *at = now;
                *skipped = 0;
                Some(repeated)
            }
            None => {
                last.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

/// Writes an entry off the caller's thread when there is a runtime (the caller may be an
/// async worker), else at once; a failure is logged.
fn write_later(db: &Db, actor: &str, action: &'static str, subject: String, details: Value) {
    let (db, actor) = (db.clone(), actor.to_owned());
    let write = move || {
        if let Err(e) = event(&db, &actor, action, &subject, &details) {
            tracing::error!(error = %e, action, "cannot write to the audit log");
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(_) => drop(cloud_harness_memory::idle::spawn_blocking(write)),
        Err(_) => write(),
    }
}

/// An operator's `action` on a workspace `owner` owns: `workspace.access`, naming both.
pub fn access(db: &Db, actor: &str, owner: &str, workspace: &str, action: &str) {
    let key = format!("access\n{actor}\n{workspace}\n{action}");
    let Some(repeated) = throttle().admit(actor, key, ACCESS_EVERY, false) else {
        return;
    };
    let owner = if owner.is_empty() { "(none)" } else { owner };
    write_later(
        db,
        actor,
        "workspace.access",
        format!("workspace:{workspace}"),
        serde_json::json!({ "action": action, "owner": owner, "repeated": repeated }),
    );
}

/// Whether a refusal's row (`action` on `subject` by `actor`) is written now, and how many
/// refusals it stands for (see [`REFUSALS_PER_HOUR`]).
pub fn admit_refusal(actor: &str, action: &str, subject: &str) -> Option<u64> {
    let key = format!("refusal\n{actor}\n{action}\n{subject}");
    throttle().admit(actor, key, SAME_REFUSAL_EVERY, true)
}

/// Records a FORBIDDEN answer to `via` (a security event): `egress.refused` when it names a
/// URL or an address (the host allowlist, the egress proxy), else `request.refused`. Nothing
/// for other errors; a failure to record is logged. Throttled per caller (see
/// [`REFUSALS_PER_HOUR`]).
pub fn refusal(db: &Db, actor: &str, via: &str, error: &cloud_harness_error::Error) {
    if error.code != cloud_harness_error::Code::Forbidden {
        return;
    }
    let field = error
        .details
        .get("field")
        .and_then(Value::as_str)
        .unwrap_or("");
    let url = error.details.get("url").and_then(Value::as_str);
    let egress = url.is_some() || field.ends_with("url") || field.ends_with("Url");
    let action = if egress {
        "egress.refused"
    } else {
        "request.refused"
    };
    let subject = match url {
        Some(u) => format!("url:{u}"),
        None if !field.is_empty() => format!("field:{field}"),
        None => via.to_owned(),
    };
    let Some(repeated) = admit_refusal(actor, action, &subject) else {
        tracing::info!(target: "audit", actor, action, subject = %subject, via, "refusal (not written: throttled)");
        return;
    };
    let details = serde_json::json!({
        "via": via, "message": error.message, "details": error.details, "repeated": repeated,
    });
    if let Err(e) = event(db, actor, action, &subject, &details) {
        tracing::error!(error = %e, "cannot record a refusal in the audit log");
    }
}
