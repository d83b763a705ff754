//! A database held locked while probes and a client's reads must answer: SQLite by another
//! process's `BEGIN EXCLUSIVE`, PostgreSQL by `LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE`.

use super::*;
use std::io::Write;
use std::process::{Command, Stdio};
use support::api::{world_of, BIN};
use support::http::server_in;

#[test]
fn a_locked_sqlite_database_stops_neither_probes_nor_reads_and_writes_time_out_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let kit = warm_kit(&tmp);
    let s = scene(world_of(server_in(tmp, &[], &WARM_ENV)), &kit);
    let addr = s.w.server.addr;
    readyz_becomes(addr, 200);

    // Another process takes the database's write lock and keeps it.
    let state = s.w.home().join("state.db");
    let lock = rusqlite::Connection::open(&state).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let other = rusqlite::Connection::open(&state).unwrap();
    other.busy_timeout(Duration::ZERO).unwrap();
    assert!(
        other.execute_batch("BEGIN IMMEDIATE").is_err(),
        "the lock is not held"
    );

    // Writes wait for it (each at most its bound), and a flood of made-up tokens comes in.
    let operator = s.w.operator.clone();
    let writers = in_background(addr, 2, move |i| {
        let body = json!({"name": format!("w{i}"), "role": "client"});
        ("POST", "/api/v1/tokens", operator.clone(), Some(body))
    });
    let flood = in_background(addr, 48, |_| ("GET", "/api/v1/workspaces", made_up(), None));
    std::thread::sleep(Duration::from_millis(300));

    // Meanwhile the probes and the reads answer, a token never checked before included.
    reads_answer(&s, Some(&s.fresh));
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "the writes did not wait for the lock: it was not in effect"
    );
    // Readiness says the database cannot take a transaction, naming no path.
    let body = readyz_becomes(addr, 503);
    let v: Value = serde_json::from_str(&body).unwrap();
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{body}");
    assert_eq!(failed[0]["check"], "database usable", "{body}");
    names_nothing(&body, &s.w, &[&s.agent_ws, &s.operator_ws]);

    // The made-up tokens were refused; the writes end in a typed, retryable TIMEOUT.
    for f in flood {
        let (status, v) = f.join().unwrap();
        assert!(
            status == 401 || (status == 504 && v["code"] == "TIMEOUT"),
            "{status} {v}"
        );
    }
    for w in writers {
        let (status, v) = w.join().unwrap();
        assert_eq!((status, v["code"].as_str()), (504, Some("TIMEOUT")), "{v}");
        assert_eq!(v["details"]["retryable"], true, "{v}");
    }
    let tokens = s.w.op("GET", "/api/v1/tokens", None).to_string();
    assert!(
        !tokens.contains("\"w0\""),
        "a timed-out write was kept: {tokens}"
    );

    // Once the lock is let go, writes go through again and the server is ready.
    drop(other);
    drop(lock);
    s.w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "after", "role": "client"})),
    );
    readyz_becomes(addr, 200);
}

/// A `psql` session holding `LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE` until dropped (it
/// waits for more input inside the transaction; killed, its session ends and the lock goes).
struct TableLock(std::process::Child);

impl TableLock {
    fn take(db: &support::postgres::Database) -> TableLock {
        let mut child = Command::new("psql")
            .args([db.url().as_str(), "-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b"BEGIN;\nLOCK TABLE tokens IN ACCESS EXCLUSIVE MODE;\n")
            .unwrap();
        stdin.flush().unwrap();
        let held = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                    WHERE c.relname = 'tokens' AND l.mode = 'AccessExclusiveLock' AND l.granted";
        let deadline = Instant::now() + Duration::from_secs(10);
        while db.query(held).unwrap() != "1" {
            assert!(Instant::now() < deadline, "psql never took the lock");
            std::thread::sleep(Duration::from_millis(50));
        }
        TableLock(child)
    }
}

impl Drop for TableLock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_locked_postgres_table_stops_neither_probes_nor_reads_and_reads_time_out_typed() {
    if !support::postgres::available() {
        return;
    }
    let db = support::postgres::Database::new();
    let tmp = tempfile::tempdir().unwrap();
    let kit = warm_kit(&tmp);
    let url = db.url();
    let mut env = WARM_ENV.to_vec();
    env.push(("CLOUD_HARNESS_DATABASE_URL", url.as_str()));
    let s = scene(world_of(server_in(tmp, &[], &env)), &kit);
    let addr = s.w.server.addr;
    readyz_becomes(addr, 200);
    // Every session the harness opens bounds its statements' waits.
    let state = cloud_harness_control::state::Db::connect(&url, &s.w.home()).unwrap();
    let setting = |name: &str| {
        let sql = format!("SHOW {name}");
        state
            .with(|c| c.query_row(&sql, &[], |r| r.get::<String>(0)))
            .unwrap()
    };
    assert_eq!(
        (setting("lock_timeout"), setting("statement_timeout")),
        ("10s".into(), "30s".into())
    );
    // The client's check is older than the cache's second: the next one asks the database.
    std::thread::sleep(Duration::from_millis(1200));

    let lock = TableLock::take(&db);
    let flood = in_background(addr, 16, |_| ("GET", "/api/v1/workspaces", made_up(), None));
    // A caller checked in the last minute keeps being served; the probes answer.
    reads_answer(&s, None);
    let body = readyz_becomes(addr, 200);
    names_nothing(&body, &s.w, &[&s.agent_ws, &s.operator_ws]);
    // A token never checked cannot be checked now: a typed, retryable answer, not a wait.
    let (status, v) = call(addr, "GET", "/api/v1/workspaces", &s.fresh, None);
    assert_eq!((status, v["code"].as_str()), (504, Some("TIMEOUT")), "{v}");
    assert_eq!(v["details"]["retryable"], true, "{v}");
    for f in flood {
        let (status, v) = f.join().unwrap();
        assert!(
            status == 401 || (status == 504 && v["code"] == "TIMEOUT"),
            "{status} {v}"
        );
    }
    // The CLI reading the locked table waits only its lock_timeout (here the URL's own, 1 s):
    // TIMEOUT, not INTERNAL.
    let short = format!("{url}&options=-c%20lock_timeout%3D1000");
    let out = Command::new(BIN)
        .args(["token", "list"])
        .env("CLOUD_HARNESS_HOME", s.w.home())
        .env("CLOUD_HARNESS_DATABASE_URL", &short)
        .output()
        .unwrap();
    let (code, text) = support::code_and_output(out);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("TIMEOUT") && text.contains("lock timeout"),
        "{text}"
    );

    // Let go, the token never checked works.
    drop(lock);
    let (status, v) = call(addr, "GET", "/api/v1/workspaces", &s.fresh, None);
    assert_eq!(status, 200, "{v}");
}
