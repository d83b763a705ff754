//! The schema, one migration per version. Each runs once, in order, in a write transaction
//! with its version recorded; a migration is never edited once released, only followed. Most
//! of it is SQL both engines take; where they differ (an autoincrementing key, a trigger) a
//! migration has a part for each.

use super::sql::Conn;
use cloud_harness_error::{Error, Result};

struct Migration {
    version: i64,
    description: &'static str,
    /// Run in order, those for the engine at hand.
    parts: &'static [Part],
}

enum Part {
    Both(&'static str),
    Sqlite(&'static str),
    Postgres(&'static str),
}
use Part::{Both, Postgres, Sqlite};

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "workspaces and keys, tokens, browser sessions, decisions, refused runs, launch conflicts, the audit log",
        parts: &[
            Both(
                r#"
CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    request_digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('opening', 'open')),
    created_at BIGINT NOT NULL
);
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('client', 'operator')),
    hash TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at BIGINT,
    revoked_by TEXT
);
CREATE UNIQUE INDEX tokens_active_name ON tokens (name) WHERE revoked_at IS NULL;
CREATE TABLE login_codes (
    hash TEXT PRIMARY KEY,
    token_id TEXT NOT NULL REFERENCES tokens (id),
    expires_at BIGINT NOT NULL
);
CREATE TABLE browser_sessions (
    hash TEXT PRIMARY KEY,
    token_id TEXT NOT NULL REFERENCES tokens (id),
    csrf TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    skill TEXT,
    actor TEXT NOT NULL,
    reason TEXT,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    revoked_by TEXT
);
CREATE UNIQUE INDEX approvals_active ON approvals (digest) WHERE revoked_at IS NULL;
CREATE TABLE run_requests (
    digest TEXT PRIMARY KEY,
    skill TEXT NOT NULL,
    script TEXT NOT NULL,
    workspace TEXT NOT NULL,
    first_at BIGINT NOT NULL,
    last_at BIGINT NOT NULL,
    refusals BIGINT NOT NULL
);
CREATE TABLE overrides (
    id TEXT PRIMARY KEY,
    skill TEXT NOT NULL,
    source TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    revoked_by TEXT
);
CREATE UNIQUE INDEX overrides_active ON overrides (skill) WHERE revoked_at IS NULL;
CREATE TABLE launch_conflicts (
    id TEXT PRIMARY KEY,
    conflict_key TEXT NOT NULL,
    skill TEXT NOT NULL,
    tier TEXT NOT NULL,
    candidates TEXT NOT NULL,
    request TEXT NOT NULL,
    first_at BIGINT NOT NULL,
    last_at BIGINT NOT NULL,
    refusals BIGINT NOT NULL,
    actor TEXT NOT NULL,
    settled_at BIGINT,
    settled_by TEXT,
    override_id TEXT REFERENCES overrides (id)
);
CREATE UNIQUE INDEX launch_conflicts_open ON launch_conflicts (conflict_key) WHERE settled_at IS NULL;
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY,
    at BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX audit_actor ON audit (actor, seq);
CREATE INDEX audit_action ON audit (action, seq);
"#,
            ),
            Sqlite(
                r#"
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"#,
            ),
            // SQLite numbers an INTEGER PRIMARY KEY itself; PostgreSQL needs an identity.
            Postgres(
                r#"
ALTER TABLE audit ALTER COLUMN seq TYPE BIGINT, ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;
CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
"#,
            ),
        ],
    },
    Migration {
        version: 2,
        description: "skill sets and their revisions",
        parts: &[
            Both(
                r#"
CREATE TABLE sets (
    id TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL
);
CREATE TABLE set_revisions (
    set_id TEXT NOT NULL REFERENCES sets (id),
    revision BIGINT NOT NULL,
    description TEXT NOT NULL,
    members TEXT NOT NULL,
    actor TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (set_id, revision)
);
"#,
            ),
        ],
    },
    Migration {
        version: 3,
        description: "the registry and its pins",
        parts: &[
            Both(
                r#"
CREATE TABLE registry_entries (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    url TEXT NOT NULL,
    layout TEXT NOT NULL,
    default_scope TEXT NOT NULL CHECK (default_scope IN ('owner', 'workspace')),
    session_start_skill TEXT,
    origin TEXT NOT NULL CHECK (origin IN ('shipped', 'operator')),
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL
);
CREATE TABLE pins (
    id TEXT PRIMARY KEY,
    entry_id TEXT NOT NULL REFERENCES registry_entries (id),
    commit_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT,
    created_at BIGINT NOT NULL,
    superseded_at BIGINT
);
CREATE UNIQUE INDEX pins_current ON pins (entry_id) WHERE superseded_at IS NULL;
"#,
            ),
        ],
    },
    Migration {
        version: 4,
        description: "import jobs, the acquisition history, default-head resolutions",
        parts: &[
            Both(
                r#"
CREATE TABLE imports (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    actor TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    started_at BIGINT,
    finished_at BIGINT,
    result TEXT,
    error TEXT
);
CREATE INDEX imports_state ON imports (state, created_at);
CREATE TABLE head_resolutions (
    url TEXT PRIMARY KEY,
    commit_id TEXT NOT NULL,
    resolved_at BIGINT NOT NULL
);
CREATE TABLE acquisitions (
    seq INTEGER PRIMARY KEY,
    at BIGINT NOT NULL,
    toolkit TEXT NOT NULL,
    preset TEXT,
    url TEXT NOT NULL,
    requested TEXT NOT NULL,
    commit_id TEXT,
    bundle TEXT,
    mode TEXT,
    millis BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    skills BIGINT,
    result TEXT NOT NULL CHECK (result IN ('ok', 'error')),
    error_code TEXT,
    error_message TEXT,
    actor TEXT NOT NULL,
    via TEXT NOT NULL,
    subject TEXT
);
"#,
            ),
            Postgres(
                r#"
ALTER TABLE acquisitions ALTER COLUMN seq TYPE BIGINT, ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;
"#,
            ),
        ],
    },
    Migration {
        version: 5,
        description: "overrides for the workspaces of one set",
        parts: &[
            Both(
                r#"
ALTER TABLE overrides ADD COLUMN set_id TEXT REFERENCES sets (id);
DROP INDEX overrides_active;
CREATE UNIQUE INDEX overrides_active ON overrides (skill, COALESCE(set_id, '')) WHERE revoked_at IS NULL;
"#,
            ),
        ],
    },
    Migration {
        version: 6,
        description: "the runner each workspace and import job belongs to, for a database runners share",
        parts: &[Both(
            r#"
ALTER TABLE workspaces ADD COLUMN runner TEXT NOT NULL DEFAULT '';
ALTER TABLE imports ADD COLUMN runner TEXT NOT NULL DEFAULT '';
"#,
        )],
    },
    Migration {
        version: 7,
        description: "the principal each workspace belongs to; idempotency keys unique per principal",
        parts: &[
            // SQLite cannot drop a column's UNIQUE: the table is made again.
            Sqlite(
                r#"
CREATE TABLE workspaces_v7 (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('opening', 'open')),
    created_at BIGINT NOT NULL,
    runner TEXT NOT NULL DEFAULT ''
);
INSERT INTO workspaces_v7 (id, owner, idempotency_key, request_digest, state, created_at, runner)
    SELECT id, '', idempotency_key, request_digest, state, created_at, runner FROM workspaces;
DROP TABLE workspaces;
ALTER TABLE workspaces_v7 RENAME TO workspaces;
"#,
            ),
            Postgres(
                r#"
ALTER TABLE workspaces ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE workspaces DROP CONSTRAINT workspaces_idempotency_key_key;
"#,
            ),
            Both(
                r#"
CREATE UNIQUE INDEX workspaces_owner_key ON workspaces (owner, idempotency_key);
"#,
            ),
        ],
    },
    Migration {
        version: 8,
        description: "a launch conflict is recorded per principal that met it",
        parts: &[Both(
            r#"
DROP INDEX launch_conflicts_open;
CREATE UNIQUE INDEX launch_conflicts_open ON launch_conflicts (conflict_key, actor) WHERE settled_at IS NULL;
CREATE INDEX launch_conflicts_actor ON launch_conflicts (actor, last_at);
"#,
        )],
    },
    Migration {
        version: 9,
        description: "what a registry entry and a set do with skills that break the Agent Skills specification",
        parts: &[Both(
            r#"
ALTER TABLE registry_entries ADD COLUMN validation TEXT NOT NULL DEFAULT 'warn' CHECK (validation IN ('warn', 'refuse'));
ALTER TABLE set_revisions ADD COLUMN validation TEXT NOT NULL DEFAULT 'warn' CHECK (validation IN ('warn', 'refuse'));
"#,
        )],
    },
    Migration {
        version: 10,
        description: "the one commit a registry entry may serve though no branch or tag reaches it",
        parts: &[Both(
            r#"
ALTER TABLE registry_entries ADD COLUMN allow_unreachable TEXT;
"#,
        )],
    },
    Migration {
        version: 11,
        description: "the tier an acquisition served, and acquisitions found by bundle",
        parts: &[Both(
            r#"
ALTER TABLE acquisitions ADD COLUMN tier TEXT;
CREATE INDEX acquisitions_bundle ON acquisitions (bundle, seq);
"#,
        )],
    },
    Migration {
        version: 12,
        description: "signatures of bundles, one per bundle, tier, key, repository and commit; removed ones kept as tombstones",
        parts: &[Both(
            r#"
CREATE TABLE bundle_signatures (
    bundle TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('owner', 'workspace')),
    key TEXT NOT NULL,
    url TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    added_by TEXT NOT NULL,
    added_at BIGINT NOT NULL,
    removed_by TEXT,
    removed_at BIGINT,
    PRIMARY KEY (bundle, tier, key, url, commit_id)
);
"#,
        )],
    },
    Migration {
        version: 13,
        description: "skill uses where skills are served: their counts per hour and file, and their sums per day",
        parts: &[Both(
            r#"
CREATE TABLE usage_events (
    at BIGINT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('read', 'run', 'resource', 'mount')),
    workspace TEXT NOT NULL,
    principal TEXT NOT NULL,
    toolkit TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    bundle TEXT NOT NULL,
    tier TEXT NOT NULL,
    skill TEXT NOT NULL,
    file TEXT NOT NULL,
    uses BIGINT NOT NULL,
    failures BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    PRIMARY KEY (at, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, file)
);
CREATE INDEX usage_events_workspace ON usage_events (workspace, at);
CREATE TABLE usage_daily (
    day TEXT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('read', 'run', 'resource', 'mount')),
    workspace TEXT NOT NULL,
    principal TEXT NOT NULL,
    toolkit TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    bundle TEXT NOT NULL,
    tier TEXT NOT NULL,
    skill TEXT NOT NULL,
    uses BIGINT NOT NULL,
    failures BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    last_at BIGINT NOT NULL,
    PRIMARY KEY (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill)
);
CREATE INDEX usage_daily_skill ON usage_daily (toolkit, skill, day);
"#,
        )],
    },
    Migration {
        version: 14,
        description: "the usage view's index: each skill's days with who used them and how much, read without the rows",
        parts: &[Both(
            r#"
DROP INDEX usage_daily_skill;
CREATE INDEX usage_daily_view ON usage_daily
    (toolkit, skill, day, source, principal, workspace, uses, failures, last_at);
"#,
        )],
    },
    Migration {
        version: 15,
        description: "version labels on registry entries and sets, each move a revision, with an optional canary",
        parts: &[Both(
            r#"
CREATE TABLE labels (
    id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    name TEXT NOT NULL,
    revision BIGINT NOT NULL,
    value TEXT,
    canary_value TEXT,
    canary_percent BIGINT,
    actor TEXT NOT NULL,
    reason TEXT,
    created_at BIGINT NOT NULL,
    superseded_at BIGINT,
    UNIQUE (target, name, revision),
    CHECK ((canary_value IS NULL) = (canary_percent IS NULL)),
    CHECK (canary_percent IS NULL OR canary_percent BETWEEN 1 AND 99)
);
CREATE UNIQUE INDEX labels_current ON labels (target, name) WHERE superseded_at IS NULL;
"#,
        )],
    },
    Migration {
        version: 16,
        description: "the skills the daily rows hold, each with its last day: a period's page of the usage view walks these and seeks each one's days",
        parts: &[Both(
            r#"
CREATE TABLE usage_skills (
    toolkit TEXT NOT NULL,
    skill TEXT NOT NULL,
    last_day TEXT NOT NULL,
    PRIMARY KEY (toolkit, skill)
);
INSERT INTO usage_skills (toolkit, skill, last_day)
    SELECT toolkit, skill, MAX(day) FROM usage_daily GROUP BY toolkit, skill;
"#,
        )],
    },
];

/// The newest version this binary knows.
pub fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Brings the database to [`latest`], inside the caller's write transaction: two processes
/// starting at once serialize on the write lock, and the second finds the work done.
pub fn apply(conn: &Conn) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version BIGINT PRIMARY KEY,
            description TEXT NOT NULL,
            applied_at BIGINT NOT NULL
        )",
    )?;
    let current: i64 = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        crate::params![],
        |r| r.get(0),
    )?;
    if current > latest() {
        return Err(Error::internal(format!(
            "the state database is at schema version {current}, newer than this binary knows ({}): upgrade cloud-harness",
            latest()
        )));
    }
    let postgres = matches!(conn, Conn::Postgres(_));
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        for part in m.parts {
            let sql = match (part, postgres) {
                (Both(sql), _) | (Sqlite(sql), false) | (Postgres(sql), true) => sql,
                _ => continue,
            };
            conn.execute_batch(sql).map_err(|e| {
                Error::internal(format!("state database migration {}: {e}", m.version))
            })?;
        }
        conn.execute(
            "INSERT INTO schema_migrations (version, description, applied_at) VALUES ($1, $2, $3)",
            crate::params![m.version, m.description, super::now_ms()],
        )?;
    }
    Ok(())
}
