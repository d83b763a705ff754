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

/// A TCP relay on loopback in front of the test server: the network between a runner and its
/// database, cut and restored at will. While cut, every connection is closed and new ones are
/// closed as soon as they come.
pub struct Relay {
    pub port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    streams: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    pub fn start() -> Relay {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = server()
            .rsplit('@')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .to_owned();
        let relay = Relay {
            port,
            open: Default::default(),
            streams: Default::default(),
        };
        relay.open.store(true, Ordering::SeqCst);
        let (open, streams) = (relay.open.clone(), relay.streams.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !open.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let mut kept = streams.lock().unwrap();
                kept.push(client.try_clone().unwrap());
                kept.push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        relay
    }

    /// `url` (a database on the test server) reached through this relay.
    pub fn url(&self, url: &str) -> String {
        let upstream = server();
        let host = upstream.rsplit('@').next().unwrap();
        url.replacen(host, &format!("127.0.0.1:{}", self.port), 1)
    }

    /// Closes every connection and refuses new ones until [`Relay::restore`].
    pub fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
