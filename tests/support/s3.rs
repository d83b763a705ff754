//! An S3-compatible server on loopback for the fleet tests: `s3s-fs` (installed by
//! `.ci/setup`), its buckets plain folders under a root, so a test can look inside the bucket
//! (and corrupt an object) without going through S3.

use cloud_harness_provision::remote::RemoteStore;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BUCKET: &str = "skills";
const ACCESS_KEY: &str = "fleet-test";
const SECRET_KEY: &str = "fleet-test-secret";

/// Whether the server can run here; under CI its absence is a failure.
pub fn available() -> bool {
    let found = Command::new("s3s-fs")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var_os("CI").is_some() {
        panic!("s3s-fs is missing: .ci/setup installs it (cargo install s3s-fs@0.14.1 --features binary --locked)");
    }
    found
}

pub struct S3Server {
    pub root: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

impl S3Server {
    /// A server with one empty bucket, [`BUCKET`], on a free loopback port.
    pub fn start(root: &Path) -> S3Server {
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = S3Server {
            root: root.to_owned(),
            port,
            child: None,
        };
        server.resume();
        server
    }

    /// Starts the server again on its port (after [`S3Server::stop`]).
    pub fn resume(&mut self) {
        assert!(self.child.is_none());
        let child = Command::new("s3s-fs")
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(&self.root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s3s-fs runs");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `s3://skills/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The settings a runner is given, as the `AWS_*` variables that carry them.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ]
    }

    pub fn remote(&self, prefix: &str) -> RemoteStore {
        self.remote_at(self.port, prefix)
    }

    /// [`S3Server::remote`] through another loopback port (a relay in front of the server).
    pub fn remote_at(&self, port: u16, prefix: &str) -> RemoteStore {
        let mut settings = self.settings();
        settings[0].1 = format!("http://127.0.0.1:{port}");
        let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        RemoteStore::open(&self.url(prefix), &pairs).unwrap()
    }

    /// Where the server keeps the object at `key` of the bucket.
    pub fn file(&self, key: &str) -> PathBuf {
        self.root.join(BUCKET).join(key)
    }

    /// Every key under `prefix` in the bucket, sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let base = self.root.join(BUCKET);
        let mut out = Vec::new();
        walk(&base, &base.join(prefix), &mut out);
        out.sort();
        out
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
