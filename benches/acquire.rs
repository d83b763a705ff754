//! Cold acquisition of a 50-skill toolkit against `git clone --depth 1` of the same repository
//! from the same local HTTPS server, in-process and in a helper container (made for the fetch,
//! or taken from the standby `serve` keeps), and the warm start; and a cold `workspace_open` of
//! two toolkits (14 and 41 skills, the sizes of the two presets) in each mode against
//! `git clone --depth 1` of both, one after the other; and the provenance check of a pinned
//! commit (`reach`): at a branch's tip against `git ls-remote`, 200 commits down a branch
//! against `git clone --shallow-since`, and on a warm start with and without a recorded
//! result; in one run, interleaved (medians).
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
    // A branch 200 commits long: its first commit is found in its history, its tip advertised.
    let long = Repo::create(&repos, "long.git", false);
    let long_commits: Vec<String> = (0..200)
        .map(|n| {
            long.commit(dir(vec![(
                "skills",
                Node::Dir(skills_of(&format!("l{n}-"), 1)),
            )]))
        })
        .collect();
    let long_url = server.url("long.git");
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
    // Git itself, reaching the server as the fetches do; its standard output.
    let git = |args: &[&str]| -> String {
        let out = Command::new("git")
            .arg("-c")
            .arg(format!(
                "http.curloptResolve=localhost:{}:{address}",
                server.port
            ))
            .args(args)
            .env("GIT_SSL_CAINFO", &certs.ca)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let (mut ours, mut clone, mut warm, mut contained, mut standing) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut open_ours, mut open_contained, mut open_standing, mut clone_both) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut at_tip, mut ls_remote, mut in_history, mut shallow_since) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut warm_checked, mut warm_unrecorded) = (Vec::new(), Vec::new());
    // The commits of `long` and when they were made (all in the same few seconds).
    let first = gix::ObjectId::from_hex(long_commits[0].as_bytes()).unwrap();
    let tip = gix::ObjectId::from_hex(long_commits[199].as_bytes()).unwrap();
    let committed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
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
        assert_eq!(a.record.reach.as_ref().map(|r| r.reachable), Some(true));

        // A warm start reads the recorded result; the same record without one, for the cost.
        let t = Instant::now();
        p.acquire(&toolkit).unwrap();
        warm_checked.push(t.elapsed());
        let index = p.index();
        let unrecorded = cloud_harness_provision::index::BundleRecord {
            reach: None,
            ..index.get(&a.record.key).unwrap()
        };
        index.put(&unrecorded).unwrap();
        let t = Instant::now();
        p.acquire(&toolkit).unwrap();
        warm_unrecorded.push(t.elapsed());
        index.put(&a.record).unwrap();

        // The check alone, cold: a tip (refs only), then a commit 200 down (its history).
        let check = |commit: gix::ObjectId| {
            let ceiling = cloud_harness_provision::fetch::Ceiling {
                max_bytes: 1 << 30,
                setting: "bench",
                max_object: 1 << 30,
                object_setting: "bench",
            };
            let reach = cloud_harness_provision::reach::check(
                &long_url,
                commit,
                gix::hash::Kind::Sha1,
                committed,
                None,
                &p.transport().unwrap(),
                &p.store.tmp_dir(),
                Instant::now() + Duration::from_secs(60),
                &ceiling,
                &Default::default(),
            )
            .unwrap();
            assert!(reach.reachable);
            reach.how
        };
        let t = Instant::now();
        assert_eq!(check(tip), cloud_harness_provision::reach::How::Advertised);
        at_tip.push(t.elapsed());
        let t = Instant::now();
        let listed = git(&["ls-remote", &long_url]);
        ls_remote.push(t.elapsed());
        assert!(listed.contains(&long_commits[199]));
        let t = Instant::now();
        assert_eq!(check(first), cloud_harness_provision::reach::How::History);
        in_history.push(t.elapsed());
        let since = format!("--shallow-since=@{}", committed - 86_400);
        let dest = tmp.path().join(format!("since{run}"));
        let t = Instant::now();
        git(&[
            "clone",
            "-q",
            "--bare",
            "--no-single-branch",
            &since,
            &long_url,
            dest.to_str().unwrap(),
        ]);
        shallow_since.push(t.elapsed());

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

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (at_tip, ls_remote, in_history, shallow_since) = (
        median(at_tip),
        median(ls_remote),
        median(in_history),
        median(shallow_since),
    );
    let (warm_checked, warm_unrecorded) = (median(warm_checked), median(warm_unrecorded));
    println!();
    println!(
        "provenance: is a pinned commit reachable from a branch or tag, median of {RUNS} runs"
    );
    println!("| what | median | ratio |");
    println!("|---|---|---|");
    println!(
        "| check of a branch's tip, asking for the refs (a helper container's fetch; in-process, the fetch's own refs are read) | {:.1} ms | {:.2}x `git ls-remote` ({:.1} ms) |",
        ms(at_tip),
        ms(at_tip) / ms(ls_remote),
        ms(ls_remote)
    );
    println!(
        "| check of a commit 200 down a branch (history since a day before it) | {:.1} ms | {:.2}x `git clone --bare --shallow-since` ({:.1} ms) |",
        ms(in_history),
        ms(in_history) / ms(shallow_since),
        ms(shallow_since)
    );
    println!(
        "| warm start, the result recorded (read, nothing asked) | {:.3} ms | {:.2}x the same record without one ({:.3} ms); goal: the check < 1 ms |",
        ms(warm_checked),
        ms(warm_checked) / ms(warm_unrecorded),
        ms(warm_unrecorded)
    );
}
