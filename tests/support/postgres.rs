//! PostgreSQL for the tests: the server `.ci/setup` starts on loopback, one new database per
//! test (made with `psql`, dropped when the test ends). Test binaries whose name ends in
//! `_postgres` (the control-plane suites again, see Cargo.toml) give every server they start
//! a database of its own there instead of SQLite.

use std::process::Command;

/// The server and a role on it that may create databases (no database named).
fn server() -> String {
    std::env::var("CLOUD_HARNESS_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://cloud_harness:cloud-harness-test@127.0.0.1:5432".to_owned())
}

/// Database `name` on the test server; plain TCP, as on loopback nothing else is needed.
fn url_of(name: &str) -> String {
    format!("{}/{name}?sslmode=disable", server())
}

pub fn admin_url() -> String {
    url_of("postgres")
}

/// Whether this test binary runs its servers on PostgreSQL.
pub fn selected() -> bool {
    env!("CARGO_CRATE_NAME").ends_with("_postgres")
}

/// Whether the server answers; when it does not, a test needing it fails in CI and says so
/// elsewhere.
pub fn available() -> bool {
    let up = psql(&admin_url(), "SELECT 1").is_ok();
    if !up {
        assert!(
            std::env::var_os("CI").is_none(),
            "no PostgreSQL at {} (run .ci/setup as root)",
            admin_url()
        );
        eprintln!("skipped: no PostgreSQL at {}", admin_url());
    }
    up
}

fn psql(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args([
            url,
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A database of one test's own, dropped with it.
pub struct Database {
    name: String,
}

impl Database {
    pub fn new() -> Database {
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes).unwrap();
        let name = format!(
            "t_{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        psql(&admin_url(), &format!("CREATE DATABASE {name}")).unwrap();
        Database { name }
    }

    /// Its URL, as `CLOUD_HARNESS_DATABASE_URL` takes it.
    pub fn url(&self) -> String {
        url_of(&self.name)
    }

    /// One statement's answer, as `psql` prints it (unaligned, tuples only).
    pub fn query(&self, sql: &str) -> Result<String, String> {
        psql(&self.url(), sql)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = psql(
            &admin_url(),
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}
