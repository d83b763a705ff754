//! A second runner's start through the store of record: a 50-skill toolkit (250 files)
//! published by one runner to a real S3-compatible server on loopback (`s3s-fs`), then
//! acquired by a runner with an empty local store, against a local warm start and a cold git
//! acquisition from the same machine's HTTPS git server; and the publication itself. In one
//! run, interleaved (medians). Then `workspace_open` of that toolkit, warm, with the control
//! plane on PostgreSQL (loopback) against SQLite, interleaved.
//!
//! `cargo bench --bench fleet` (needs s3s-fs, as `.ci/setup` installs it, and python3, git and
//! openssl, as the tests do; the last part PostgreSQL as `.ci/setup` starts it).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_control::toolkit::{GitSpec, ToolkitSpec};
use cloud_harness_provision::{Acquired, Provisioner};
use cloud_harness_store::cas::Store;
use std::time::{Duration, Instant};
use support::s3::S3Server;
use support::{Node, Repo};

const RUNS: usize = 7;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// 50 skills of 5 files each (SKILL.md, two references, a script, an asset), distinct bytes.
fn toolkit() -> Node {
    let skills = support::generated_skills("", 50, &mut 0x9e37_79b9_u64);
    Node::Dir(vec![(b"skills".to_vec(), Node::Dir(skills))])
}

fn main() {
    if !support::s3::available() {
        eprintln!("skipped: s3s-fs is not installed (cargo install --locked s3s-fs --version 0.14.1 --features binary)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = support::Certs::new(&tmp.path().join("certs"));
    let server = support::GitServer::start(&repos, &certs);
    let s3 = S3Server::start(&tmp.path().join("s3"));
    let commit = Repo::create(&repos, "team/fifty.git", false).commit(toolkit());
    let spec = ToolkitSpec::Git(GitSpec {
        instance_id: "fifty".into(),
        url: server.url("team/fifty.git"),
        git_ref: Some(commit),
        scope: None,
        subdirectory: None,
        layout: None,
        skills: None,
    });
    let mut fresh = 0;
    let mut runner = |prefix: Option<&str>| -> Provisioner {
        fresh += 1;
        let store = Store::open(tmp.path().join(format!("store-{fresh}"))).unwrap();
        let p = server.provisioner(&certs, store, "", "127.0.0.0/8", "");
        p.with_remote(prefix.map(|prefix| s3.remote(prefix)))
    };
    let acquire = |p: &Provisioner| -> (Acquired, Duration) {
        let toolkit = spec.resolve(p.hosts()).unwrap();
        let started = Instant::now();
        let a = p.acquire(&toolkit).unwrap();
        (a, started.elapsed())
    };

    let (mut cold, mut publish, mut remote, mut local) = (vec![], vec![], vec![], vec![]);
    let mut objects = 0;
    for run in 0..RUNS {
        // A cold acquisition from git, no store of record.
        let a = runner(None);
        let (got, took) = acquire(&a);
        assert_eq!(got.mode, "in-process");
        cold.push(took);
        // Its publication to a prefix of its own, so every run publishes everything.
        let prefix = format!("run-{run}");
        let started = Instant::now();
        let moved = s3.remote(&prefix).publish(&a.store, &got.record).unwrap();
        publish.push(started.elapsed());
        objects = moved.objects;
        // A second runner, its local store empty: from object storage.
        let b = runner(Some(&prefix));
        let (got_b, took) = acquire(&b);
        assert_eq!(
            (got_b.mode, got_b.record.bundle),
            ("remote", got.record.bundle)
        );
        remote.push(took);
        // And again on that runner: a local warm start.
        let (again, took) = acquire(&b);
        assert_eq!(again.mode, "warm");
        local.push(took);
    }
    let (cold, publish, remote, local) =
        (median(cold), median(publish), median(remote), median(local));
    println!("a 50-skill toolkit (250 files, {objects} objects) through a store of record on loopback s3s-fs, median of {RUNS} runs");
    println!("| what | median | ratio |");
    println!("|---|---|---|");
    println!(
        "| warm start on a second runner, from object storage | {} | 1.00x |",
        ms(remote)
    );
    println!(
        "| local warm start (the same runner, again) | {} | {:.2}x |",
        ms(local),
        local.as_secs_f64() / remote.as_secs_f64()
    );
    println!(
        "| cold acquisition from git (in-process) | {} | {:.2}x |",
        ms(cold),
        cold.as_secs_f64() / remote.as_secs_f64()
    );
    println!(
        "| publication of the toolkit to object storage | {} | {:.2}x |",
        ms(publish),
        publish.as_secs_f64() / remote.as_secs_f64()
    );
    packs(
        &tmp,
        &server,
        &certs,
        &s3,
        &spec,
        &format!("run-{}", RUNS - 1),
    );
    ranges(&tmp, &repos, &server, &certs, &s3);
    control_plane(&tmp, &server, &certs, &spec);
}

/// A second runner's start from object storage with the bundle's pack (one request) against
/// object by object (a request each), on loopback and through a relay that makes every request
/// 20 ms late, as a bucket across a network would; interleaved, medians.
fn packs(
    tmp: &tempfile::TempDir,
    server: &support::GitServer,
    certs: &support::Certs,
    s3: &S3Server,
    spec: &ToolkitSpec,
    prefix: &str,
) {
    let relay = support::latency::Latency::start(
        std::net::SocketAddr::from(([127, 0, 0, 1], s3.port)),
        Duration::from_millis(20),
    );
    let mut n = 0;
    let mut start = |port: u16, packs: bool| -> Duration {
        n += 1;
        let store = Store::open(tmp.path().join(format!("store-packs-{n}"))).unwrap();
        let remote = s3.remote_at(port, prefix).with_packs(packs);
        let p = server
            .provisioner(certs, store, "", "127.0.0.0/8", "")
            .with_remote(Some(remote));
        let toolkit = spec.resolve(p.hosts()).unwrap();
        let started = Instant::now();
        let got = p.acquire(&toolkit).unwrap();
        let took = started.elapsed();
        assert_eq!(got.mode, "remote");
        took
    };
    // [loopback, 20 ms] x [pack, objects]
    let mut took: [[Vec<Duration>; 2]; 2] = Default::default();
    for run in 0..RUNS {
        for (i, port) in [s3.port, relay.addr.port()].into_iter().enumerate() {
            // Which goes first alternates, so neither always meets a cold server.
            for packs in [run % 2 == 0, run % 2 == 1] {
                took[i][usize::from(!packs)].push(start(port, packs));
            }
        }
    }
    println!("a second runner's start of the 50-skill toolkit from object storage: its pack against object by object, median of {RUNS} runs, interleaved");
    println!("| bucket | with the pack (1 request) | object by object | ratio |");
    println!("|---|---|---|---|");
    for (i, bucket) in ["s3s-fs on loopback", "the same, every request 20 ms late"]
        .into_iter()
        .enumerate()
    {
        let [pack, objects] = std::mem::take(&mut took[i]).map(median);
        println!(
            "| {bucket} | {} | {} | {:.2}x |",
            ms(pack),
            ms(objects),
            pack.as_secs_f64() / objects.as_secs_f64()
        );
    }
}

/// Bytes a second the relay serves each connection at in [`ranges`]: what one connection to a
/// bucket in the same region commonly gets.
const CONNECTION_RATE: u64 = 64 << 20;

/// A second runner's start of a large toolkit (48 MiB in four files) from its pack in one
/// request against ranges of 8 MiB, four at once, through a relay that makes every request
/// 20 ms late and serves each connection at [`CONNECTION_RATE`]; interleaved, medians.
fn ranges(
    tmp: &tempfile::TempDir,
    repos: &std::path::Path,
    server: &support::GitServer,
    certs: &support::Certs,
    s3: &S3Server,
) {
    let skills = (0..4)
        .map(|i| {
            let name = format!("large-{i}");
            let md = format!("---\nname: {name}\ndescription: A large skill.\n---\n");
            let node = Node::Dir(vec![
                (b"SKILL.md".to_vec(), Node::File(md.into_bytes())),
                (
                    b"assets".to_vec(),
                    Node::Dir(vec![(
                        b"model.bin".to_vec(),
                        Node::File(support::noise(12 << 20, i + 1)),
                    )]),
                ),
            ]);
            (name.into_bytes(), node)
        })
        .collect();
    let tree = Node::Dir(vec![(b"skills".to_vec(), Node::Dir(skills))]);
    let commit = Repo::create(repos, "team/large.git", false).commit(tree);
    let spec = ToolkitSpec::Git(GitSpec {
        instance_id: "large".into(),
        url: server.url("team/large.git"),
        git_ref: Some(commit),
        scope: None,
        subdirectory: None,
        layout: None,
        skills: None,
    });
    let mut n = 0;
    let mut runner = |remote: cloud_harness_provision::remote::RemoteStore| {
        n += 1;
        let store = Store::open(tmp.path().join(format!("store-large-{n}"))).unwrap();
        server
            .provisioner(certs, store, "", "127.0.0.0/8", "")
            .with_remote(Some(remote))
    };
    // Published by a first runner (a cold acquisition from git with a store of record).
    let first = runner(s3.remote("large"));
    let toolkit = spec.resolve(first.hosts()).unwrap();
    let got = first.acquire(&toolkit).unwrap();
    assert_eq!(got.mode, "in-process");
    let relay = support::latency::Latency::paced(
        std::net::SocketAddr::from(([127, 0, 0, 1], s3.port)),
        Duration::from_millis(20),
        Some(CONNECTION_RATE),
    );
    // [relay, loopback] x [one request, ranges]
    let mut took: [[Vec<Duration>; 2]; 2] = Default::default();
    for run in 0..RUNS {
        for (i, port) in [relay.addr.port(), s3.port].into_iter().enumerate() {
            for ranged in [run % 2 == 0, run % 2 == 1] {
                let mut remote = s3.remote_at(port, "large");
                if !ranged {
                    remote = remote.with_range_bytes(u64::MAX);
                }
                let p = runner(remote);
                let started = Instant::now();
                let again = p.acquire(&toolkit).unwrap();
                took[i][usize::from(ranged)].push(started.elapsed());
                assert_eq!(
                    (again.mode, again.record.bundle),
                    ("remote", got.record.bundle)
                );
            }
        }
    }
    println!("a second runner's start of a 48 MiB toolkit from its pack: one request against ranges of 8 MiB, 4 at once; median of {RUNS} runs, interleaved");
    println!("| bucket | one request | ranges, 4 at once | ratio |");
    println!("|---|---|---|---|");
    let buckets = [
        format!(
            "every request 20 ms late, each connection at {} MiB/s",
            CONNECTION_RATE >> 20
        ),
        "s3s-fs on loopback, no limit".to_owned(),
    ];
    for (i, bucket) in buckets.iter().enumerate() {
        let [whole, ranged] = std::mem::take(&mut took[i]).map(median);
        println!(
            "| {bucket} | {} | {} | {:.2}x |",
            ms(whole),
            ms(ranged),
            ranged.as_secs_f64() / whole.as_secs_f64()
        );
    }
}

/// `workspace_open` (and close) of the toolkit, warm in the local store, on a control plane
/// in SQLite and one in PostgreSQL, interleaved.
fn control_plane(
    tmp: &tempfile::TempDir,
    server: &support::GitServer,
    certs: &support::Certs,
    spec: &ToolkitSpec,
) {
    if !support::postgres::available() {
        return;
    }
    use cloud_harness_workspace::{OpenRequest, Workspaces};
    let database = support::postgres::Database::new();
    let store = Store::open(tmp.path().join("store-open")).unwrap();
    let workspaces = |engine: &str| {
        let p = server.provisioner(certs, store.clone(), "", "127.0.0.0/8", "");
        // Db::open reads the variable; set for the PostgreSQL one only, before any thread
        // of this process could read the environment.
        if engine == "postgres" {
            std::env::set_var("CLOUD_HARNESS_DATABASE_URL", database.url());
        }
        let ws = Workspaces::with_executors(
            tmp.path().join(format!("home-{engine}")),
            p,
            false,
            cloud_harness_executor::Settings::with_kind(cloud_harness_executor::Kind::Host),
        )
        .unwrap();
        std::env::remove_var("CLOUD_HARNESS_DATABASE_URL");
        assert_eq!(ws.db().engine(), engine);
        ws
    };
    let engines = [
        ("sqlite", workspaces("sqlite")),
        ("postgres", workspaces("postgres")),
    ];
    let rounds = 15;
    let mut took: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for r in 0..=rounds {
        for (i, (engine, ws)) in engines.iter().enumerate() {
            let started = Instant::now();
            let opened = ws
                .open(OpenRequest {
                    repository_url: None,
                    idempotency_key: format!("{engine}-{r}"),
                    toolkits: vec![spec.clone()],
                    allow_toolkit_workspace_changes: false,
                    idle_pause: true,
                })
                .unwrap();
            let open = started.elapsed();
            ws.close(opened["workspace"].as_str().unwrap()).unwrap();
            // The first round warms the store (the first open acquires from git) and caches.
            if r > 0 {
                took[i].push(open);
            }
        }
    }
    let [sqlite, postgres] = took.map(median);
    println!("workspace_open of the toolkit, warm ({rounds} rounds, interleaved, medians; no mount, host executor):");
    println!("| control plane | median | ratio |");
    println!("|---|---|---|");
    println!("| SQLite (embedded) | {} | 1.00x |", ms(sqlite));
    println!(
        "| PostgreSQL 15 on loopback | {} | {:.2}x |",
        ms(postgres),
        postgres.as_secs_f64() / sqlite.as_secs_f64()
    );
}
