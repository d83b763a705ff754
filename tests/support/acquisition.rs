//! A world for toolkit acquisition tests: a local HTTPS git server with its own CA, a store,
//! and the ways tests look at what an acquisition left.

use super::{Certs, GitServer};
use cloud_harness_control::toolkit::{GitSpec, ToolkitSpec};
use cloud_harness_error::Error;
use cloud_harness_provision::{Acquired, Provisioner};
use cloud_harness_store::cas::{materialize, Store};
use std::fs;
use std::path::{Path, PathBuf};

pub struct World {
    pub tmp: tempfile::TempDir,
    pub repos: PathBuf,
    pub certs: Certs,
    pub server: GitServer,
    pub store: Store,
}

pub fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let server = GitServer::start(&repos, &certs);
    let store = Store::open(tmp.path().join("store")).unwrap();
    World {
        tmp,
        repos,
        certs,
        server,
        store,
    }
}

impl World {
    pub fn provisioner(&self, rewrites: &str) -> Provisioner {
        // The test server is on loopback, which the egress proxy opens only when told to.
        self.server
            .provisioner(&self.certs, self.store.clone(), rewrites, "127.0.0.0/8", "")
    }

    pub fn acquire(&self, spec: ToolkitSpec) -> Result<Acquired, Error> {
        let p = self.provisioner("");
        p.acquire(&spec.resolve(p.hosts())?)
    }

    /// The bundle written out as plain files.
    pub fn materialized(&self, a: &Acquired) -> PathBuf {
        let dest = self
            .tmp
            .path()
            .join(format!("bundle-{}", &a.record.bundle.hex()[..8]));
        if !dest.exists() {
            materialize(&self.store, &a.record.bundle, &dest).unwrap();
        }
        dest
    }

    /// Every file of the store (objects, roots, index, temp), for "left as it was" checks.
    pub fn snapshot(&self) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(self.store.root(), self.store.root(), &mut out);
        out.retain(|p| p != "lock");
        out.sort();
        out
    }
}

pub fn git(url: String, id: &str, commit: Option<&str>) -> GitSpec {
    GitSpec {
        instance_id: id.into(),
        url,
        git_ref: commit.map(str::to_owned),
        scope: None,
        subdirectory: None,
        layout: None,
        skills: None,
    }
}

pub fn names(path: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
