//! The audit log: every operator action and security event, append-only (the database refuses
//! updates and deletes of it), each with its actor, time and subject; also written as a
//! structured log line (target `audit`).

use crate::params;
use crate::state::{self, Db};
use cloud_harness_fs::Result;
use serde::Serialize;
use serde_json::Value;

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

/// Records a FORBIDDEN answer to `via` (a security event): `egress.refused` when it names a
/// URL or an address (the host allowlist, the egress proxy), else `request.refused`. Nothing
/// for other errors; a failure to record is logged.
pub fn refusal(db: &Db, actor: &str, via: &str, error: &cloud_harness_fs::Error) {
    if error.code != cloud_harness_fs::Code::Forbidden {
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
    let details =
        serde_json::json!({ "via": via, "message": error.message, "details": error.details });
    if let Err(e) = event(db, actor, action, &subject, &details) {
        tracing::error!(error = %e, "cannot record a refusal in the audit log");
    }
}
