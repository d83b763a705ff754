//! Cold acquisition of a 50-skill toolkit against `git clone --depth 1` of the same repository
//! from the same local HTTPS server, in-process and in a helper container (made for the fetch,
//! or taken from the standby `serve` keeps), and the warm start; and a cold `workspace_open` of
//! two toolkits (14 and 41 skills, the sizes of the two presets) in each mode against
//! `git clone --depth 1` of both, one after the other; in one run, interleaved (medians).
//!
//! `cargo bench --bench acquire` (needs python3, git and openssl, as the tests do; the
//! container row needs a Docker engine).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_control::toolkit::{GitSpec, ToolkitSpec};
use cloud_harness_executor::{Kind, Settings};
use cloud_harness_provision::sandbox::Sandbox;
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, Workspaces};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{dir, Node, Repo};

const RUNS: usize = 7;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = support::Certs::new(&tmp.path().join("certs"));
    // With a Docker engine the server listens on the bridge address, so that helper containers
    // (through their proxy) and in-process fetches reach the same server.
    let sandbox = Sandbox::detect(std::path::PathBuf::from(env!(
        "CARGO_BIN_EXE_cloud-harness"
    )));
    let address = match &sandbox {
        Some(_) => support::bridge_address(),
        None => "127.0.0.1".to_owned(),
    };
    let server = support::GitServer::start_on(&repos, &certs, &address);

    // 50 skills of 5 files each (SKILL.md, two references, a script, an asset).
    let mut seed = 0x2545_f491_u64;
    let mut skills_of = |prefix: &str, n: usize| support::generated_skills(prefix, n, &mut seed);
    let repo = Repo::create(&repos, "toolkit.git", false);
    let commit = repo.commit(dir(vec![("skills", Node::Dir(skills_of("", 50)))]));
    let url = server.url("toolkit.git");
    // The pair a workspace opens: (url, commit) of 14 and 41 skills.
    let pair: Vec<(String, String)> = [("small", 14), ("large", 41)]
        .iter()
        .map(|(name, n)| {
            let repo_name = format!("{name}.git");
            let r = Repo::create(&repos, &repo_name, false);
            let skills = skills_of(&format!("{name}-"), *n);
            let c = r.commit(dir(vec![("skills", Node::Dir(skills))]));
            (server.url(&repo_name), c)
        })
        .collect();

    let provisioner = |store: Store, sandbox: Option<Sandbox>| {
        server
            .provisioner(
                &certs,
                store,
                "",
                &format!("{address}/32"),
                &format!("localhost={address}"),
            )
            .with_sandbox(sandbox)
    };
    let spec = ToolkitSpec::Git(GitSpec {
        instance_id: "bench".into(),
        url: url.clone(),
        git_ref: Some(commit.clone()),
        scope: None,
        subdirectory: None,
        layout: None,
        skills: None,
    });
    let toolkit = spec
        .resolve(provisioner(Store::open(tmp.path().join("probe")).unwrap(), None).hosts())
        .unwrap();
    if let Some(s) = &sandbox {
        // The helper image is built once; that is not what is measured.
        let p = provisioner(
            Store::open(tmp.path().join("image")).unwrap(),
            Some(s.clone()),
        );
        p.acquire(&toolkit).unwrap();
    }
    // A second engine handle whose helpers wait on standby, as `serve` keeps them (2); each
    // measurement starts once the standby is full again, as on a server between two opens.
    let ready = Sandbox::detect(std::path::PathBuf::from(env!(
        "CARGO_BIN_EXE_cloud-harness"
    )));
    if let Some(r) = &ready {
        let p = provisioner(Store::open(tmp.path().join("probe2")).unwrap(), None);
        r.keep_warm(2, &p.egress, p.limits);
    }
    let standby_full = |r: &Sandbox| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.on_standby() < 2 {
            assert!(Instant::now() < deadline, "the standby never filled");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let git_spec = |url: &str, commit: &str, id: &str| {
        ToolkitSpec::Git(GitSpec {
            instance_id: id.into(),
            url: url.into(),
            git_ref: Some(commit.into()),
            scope: None,
            subdirectory: None,
            layout: None,
            skills: None,
        })
    };
    // A cold open of both toolkits into a new store and home; returns its time.
    let open_both = |run: usize, sandbox: Option<Sandbox>, mode: &str| -> Duration {
        let root = tmp.path().join(format!("open-{mode}-{run}"));
        let p = provisioner(Store::open(root.join("store")).unwrap(), sandbox);
        let workspaces = Workspaces::with_executors(
            root.join("home"),
            p,
            false,
            Settings::with_kind(Kind::Host),
        )
        .unwrap();
        let request = OpenRequest {
            repository_url: None,
            idempotency_key: "bench".into(),
            toolkits: vec![
                git_spec(&pair[0].0, &pair[0].1, "small"),
                git_spec(&pair[1].0, &pair[1].1, "large"),
            ],
            allow_toolkit_workspace_changes: false,
            idle_pause: true,
        };
        let t = Instant::now();
        let opened = workspaces.open(request).unwrap();
        let took = t.elapsed();
        let toolkits = opened["toolkits"].as_array().unwrap();
        assert_eq!(toolkits.len(), 2, "{opened}");
        assert!(
            toolkits.iter().all(|t| t["mode"] == mode),
            "{mode}: {opened}"
        );
        took
    };

    // The baseline: `git clone --depth 1` from the same server at the address the fetches use.
    let git_clone = |url: &str, dest: &std::path::Path| {
        let status = Command::new("git")
            .arg("-c")
            .arg(format!(
                "http.curloptResolve=localhost:{}:{address}",
                server.port
            ))
            .args(["clone", "-q", "--depth", "1", url])
            .arg(dest)
            .env("GIT_SSL_CAINFO", &certs.ca)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    };
    let (mut ours, mut clone, mut warm, mut contained, mut standing) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut open_ours, mut open_contained, mut open_standing, mut clone_both) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..RUNS {
        let store = Store::open(tmp.path().join(format!("store{run}"))).unwrap();
        let p = provisioner(store, None);
        let t = Instant::now();
        let a = p.acquire(&toolkit).unwrap();
        ours.push(t.elapsed());
        assert!(!a.warm && a.record.skills == 50 && a.mode == "in-process");

        let t = Instant::now();
        let a = p.acquire(&toolkit).unwrap();
        warm.push(t.elapsed());
        assert!(a.warm);

        if let Some(s) = &sandbox {
            let store = Store::open(tmp.path().join(format!("contained{run}"))).unwrap();
            let p = provisioner(store, Some(s.clone()));
            let t = Instant::now();
            let a = p.acquire(&toolkit).unwrap();
            contained.push(t.elapsed());
            assert!(a.mode == "container" && a.record.skills == 50);
        }
        if let Some(r) = &ready {
            standby_full(r);
            let store = Store::open(tmp.path().join(format!("standing{run}"))).unwrap();
            let p = provisioner(store, Some(r.clone()));
            let t = Instant::now();
            let a = p.acquire(&toolkit).unwrap();
            standing.push(t.elapsed());
            assert!(a.mode == "container" && a.record.skills == 50);
        }

        let t = Instant::now();
        git_clone(&url, &tmp.path().join(format!("clone{run}")));
        clone.push(t.elapsed());

        open_ours.push(open_both(run, None, "in-process"));
        if let Some(s) = &sandbox {
            open_contained.push(open_both(run, Some(s.clone()), "container"));
        }
        if let Some(r) = &ready {
            standby_full(r);
            open_standing.push(open_both(run + RUNS, Some(r.clone()), "container"));
        }
        let t = Instant::now();
        for (i, (url, _)) in pair.iter().enumerate() {
            git_clone(url, &tmp.path().join(format!("clone-both{run}-{i}")));
        }
        clone_both.push(t.elapsed());
    }
    let (ours, clone, warm) = (median(ours), median(clone), median(warm));
    let contained = (!contained.is_empty()).then(|| median(contained));
    let standing = (!standing.is_empty()).then(|| median(standing));
    println!("acquisition of a 50-skill toolkit (250 files) from a local HTTPS server, median of {RUNS} runs");
    println!("| what | median | ratio |");
    println!("|---|---|---|");
    println!(
        "| `git clone --depth 1` (baseline) | {:.0} ms | 1.00x |",
        clone.as_secs_f64() * 1e3
    );
    println!(
        "| cold acquisition (fetch, stage, normalize, publish) | {:.0} ms | {:.2}x |",
        ours.as_secs_f64() * 1e3,
        ours.as_secs_f64() / clone.as_secs_f64()
    );
    if let Some(c) = contained {
        println!(
            "| cold acquisition in a helper container made for it (warm network and proxy) | {:.0} ms | {:.2}x (vs in-process: {:.2}x) |",
            c.as_secs_f64() * 1e3,
            c.as_secs_f64() / clone.as_secs_f64(),
            c.as_secs_f64() / ours.as_secs_f64()
        );
    }
    if let Some(c) = standing {
        println!(
            "| cold acquisition in a helper container on standby | {:.0} ms | {:.2}x (vs in-process: {:.2}x) |",
            c.as_secs_f64() * 1e3,
            c.as_secs_f64() / clone.as_secs_f64(),
            c.as_secs_f64() / ours.as_secs_f64()
        );
    }
    println!(
        "| warm start (index hit, all objects checked present) | {:.2} ms | goal < 20 ms |",
        warm.as_secs_f64() * 1e3
    );

    let (open_ours, clone_both) = (median(open_ours), median(clone_both));
    println!();
    println!("a cold workspace_open of two toolkits (14 + 41 skills), median of {RUNS} runs");
    println!("| what | median | ratio |");
    println!("|---|---|---|");
    println!(
        "| `git clone --depth 1` of both, one after the other (baseline) | {:.0} ms | 1.00x |",
        clone_both.as_secs_f64() * 1e3
    );
    println!(
        "| in-process | {:.0} ms | {:.2}x |",
        open_ours.as_secs_f64() * 1e3,
        open_ours.as_secs_f64() / clone_both.as_secs_f64()
    );
    if !open_contained.is_empty() {
        let c = median(open_contained);
        println!(
            "| in helper containers made for each fetch | {:.0} ms | {:.2}x (vs in-process: {:.2}x) |",
            c.as_secs_f64() * 1e3,
            c.as_secs_f64() / clone_both.as_secs_f64(),
            c.as_secs_f64() / open_ours.as_secs_f64()
        );
    }
    if !open_standing.is_empty() {
        let c = median(open_standing);
        println!(
            "| in helper containers on standby (serve's default) | {:.0} ms | {:.2}x (vs in-process: {:.2}x, goal at most 1.5x) |",
            c.as_secs_f64() * 1e3,
            c.as_secs_f64() / clone_both.as_secs_f64(),
            c.as_secs_f64() / open_ours.as_secs_f64()
        );
    }
}
