//! What an executor costs: `workspace_open` with a docker container or the bubblewrap
//! executor against the same open without one (the development-only host executor), and
//! `skills_run` of a trivial script per backend against running that script directly on the
//! host. Medians of interleaved runs, warm store, no network. Docker keeps two spare
//! executors (made again between rounds of opens); sixteen runs at once in one workspace are
//! measured against as many runs alone just before them. Each run is a task of the
//! runtime's, as a server's calls are.
//!
//! `cargo bench --bench executor` (as root, with /dev/fuse; a backend that is not available
//! is left out and named).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_executor::{Kind, Settings};
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, RunRequest, Workspace, Workspaces};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const OPENS: usize = 9;
const RUNS: usize = 31;
const CONCURRENT: usize = 16;
const CONCURRENT_ROUNDS: usize = 10;

/// The run every figure times: `scripts/ok.sh` of the approved skill.
fn ok_run() -> RunRequest {
    RunRequest {
        skill: "alpha".into(),
        script: "scripts/ok.sh".into(),
        args: vec![],
        timeout: Duration::from_secs(30),
    }
}

/// One run of `ok.sh` in `ws`, in a task of the runtime's (as a server's calls run): its time.
async fn timed_run(ws: Arc<Workspace>, home: PathBuf) -> Duration {
    tokio::spawn(async move {
        let t = Instant::now();
        let out = ws
            .run(
                &home,
                "bench",
                ok_run(),
                CancellationToken::new(),
                |_, _| {},
            )
            .await
            .unwrap();
        let took = t.elapsed();
        assert_eq!(out["stdout"], "ok\n", "{out}");
        took
    })
    .await
    .unwrap()
}

/// `sh ok.sh` directly on the host: its time.
fn direct_run(script: &Path) -> Duration {
    let t = Instant::now();
    let out = Command::new("sh").arg(script).output().unwrap();
    let took = t.elapsed();
    assert_eq!(out.stdout, b"ok\n");
    took
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn p99(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[(xs.len() * 99 / 100).min(xs.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn available(kind: Kind) -> bool {
    kind == Kind::Host || support::executor_backend(kind.as_str())
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("kit");
    std::fs::create_dir_all(src.join("alpha/scripts")).unwrap();
    std::fs::write(
        src.join("alpha/SKILL.md"),
        "---\nname: alpha\ndescription: The alpha skill.\n---\nAlpha.\n",
    )
    .unwrap();
    std::fs::write(src.join("alpha/scripts/ok.sh"), "echo ok\n").unwrap();
    let kit = support::warm_toolkit(&store, &src, "kit");
    let mounting = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();

    let kinds: Vec<Kind> = [Kind::Host, Kind::Bwrap, Kind::Docker]
        .into_iter()
        .filter(|k| {
            let ok = available(*k);
            if !ok {
                println!(
                    "left out: the {} executor is not available here",
                    k.as_str()
                );
            }
            ok
        })
        .collect();
    let sets: Vec<(Kind, Arc<Workspaces>)> = kinds
        .iter()
        .map(|k| {
            let home = tmp.path().join(format!("home-{}", k.as_str()));
            let ws = Workspaces::with_executors(
                home,
                support::warm_provisioner(&store),
                mounting,
                // Docker keeps two spare executors, as `serve` does by default.
                Settings {
                    spares: if *k == Kind::Docker { 2 } else { 0 },
                    ..Settings::with_kind(*k)
                },
            )
            .unwrap();
            (*k, Arc::new(ws))
        })
        .collect();
    let request = |key: String| OpenRequest {
        repository_url: None,
        idempotency_key: key,
        toolkits: vec![kit.clone()],
        allow_toolkit_workspace_changes: false,
        idle_pause: true,
    };

    // Opens, interleaved across backends.
    let mut opens: Vec<Vec<Duration>> = vec![Vec::new(); sets.len()];
    for round in 0..OPENS + 1 {
        // Each round starts with the spares made again (a refill takes one container start).
        for (kind, set) in &sets {
            let started = Instant::now();
            let want = if *kind == Kind::Docker { 2 } else { 0 };
            while set.spare_executors() < want {
                assert!(started.elapsed() < Duration::from_secs(60), "no spares");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        for (i, (kind, set)) in sets.iter().enumerate() {
            let t = Instant::now();
            let result = set.open(request(format!("open-{round}"))).unwrap();
            let took = t.elapsed();
            assert_eq!(result["executor"]["kind"], json!(kind.as_str()));
            // The first round imports images and warms caches.
            if round > 0 {
                opens[i].push(took);
            }
            set.close(result["workspace"].as_str().unwrap()).unwrap();
        }
    }

    // One workspace per backend with the skill approved; trivial runs, interleaved with the
    // same script run directly on the host.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let open: Vec<_> = sets
        .iter()
        .map(|(_, set)| {
            let result = set.open(request("run".into())).unwrap();
            let digest = support::skill_digest(&result, "alpha");
            std::fs::write(
                set.home().join("operator.json"),
                json!({ "approvedSkills": [digest] }).to_string(),
            )
            .unwrap();
            set.get(result["workspace"].as_str().unwrap()).unwrap()
        })
        .collect();
    let script = src.join("alpha/scripts/ok.sh");
    let mut direct = Vec::new();
    let mut runs: Vec<Vec<Duration>> = vec![Vec::new(); sets.len()];
    for round in 0..RUNS + 1 {
        let took = direct_run(&script);
        if round > 0 {
            direct.push(took);
        }
        for (i, ws) in open.iter().enumerate() {
            let took = runtime.block_on(timed_run(ws.clone(), sets[i].1.home().to_owned()));
            if round > 0 {
                runs[i].push(took);
            }
        }
    }
    // Sixteen runs at once in one workspace, against as many runs alone just before, in
    // rounds interleaved across backends: each run's own time.
    // The same for the script directly on the host: what the machine itself allows.
    let mut alone: Vec<Vec<Duration>> = vec![Vec::new(); sets.len()];
    let mut concurrent: Vec<Vec<Duration>> = vec![Vec::new(); sets.len()];
    let (mut direct_alone, mut direct_concurrent) = (Vec::new(), Vec::new());
    for _ in 0..CONCURRENT_ROUNDS {
        direct_alone.extend((0..CONCURRENT).map(|_| direct_run(&script)));
        direct_concurrent.extend(std::thread::scope(|s| {
            let handles: Vec<_> = (0..CONCURRENT)
                .map(|_| s.spawn(|| direct_run(&script)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        }));
        for (i, ws) in open.iter().enumerate() {
            let home = sets[i].1.home().to_owned();
            for _ in 0..CONCURRENT {
                alone[i].push(runtime.block_on(timed_run(ws.clone(), home.clone())));
            }
            let took = runtime.block_on(async {
                let handles: Vec<_> = (0..CONCURRENT)
                    .map(|_| tokio::spawn(timed_run(ws.clone(), home.clone())))
                    .collect();
                let mut took = Vec::new();
                for h in handles {
                    took.push(h.await.unwrap());
                }
                took
            });
            concurrent[i].extend(took);
        }
    }
    for (ws, (_, set)) in open.iter().zip(&sets) {
        set.close(&ws.id).unwrap();
    }

    println!(
        "executors: warm store, one toolkit, {} ({OPENS} opens and {RUNS} runs per backend, interleaved; medians)",
        if mounting {
            "two FUSE mounts per workspace"
        } else {
            "no mounts (not root or no /dev/fuse)"
        }
    );
    let host_open = sets
        .iter()
        .position(|(k, _)| *k == Kind::Host)
        .map(|i| median(opens[i].clone()))
        .unwrap();
    let direct = median(direct);
    println!("| backend | workspace_open | ratio to no executor | skills_run `echo ok` | ratio to `sh` on the host |");
    println!("|---|---|---|---|---|");
    for (i, (kind, _)) in sets.iter().enumerate() {
        let open = median(opens[i].clone());
        let run = median(runs[i].clone());
        println!(
            "| {} | {:.1} ms | {:.2}x | {:.2} ms | {:.1}x |",
            kind.as_str(),
            ms(open),
            open.as_secs_f64() / host_open.as_secs_f64(),
            ms(run),
            run.as_secs_f64() / direct.as_secs_f64()
        );
    }
    println!(
        "| `sh ok.sh` directly on the host | — | — | {:.2} ms | 1.0x |",
        ms(direct)
    );
    println!();
    println!("| backend | p99 of runs alone ({CONCURRENT} before each round) | p99 of {CONCURRENT} runs at once ({CONCURRENT_ROUNDS} rounds) | ratio |");
    println!("|---|---|---|---|");
    for (i, (kind, _)) in sets.iter().enumerate() {
        let alone = p99(alone[i].clone());
        let together = p99(concurrent[i].clone());
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.1}x |",
            kind.as_str(),
            ms(alone),
            ms(together),
            together.as_secs_f64() / alone.as_secs_f64()
        );
    }
    let (alone, together) = (p99(direct_alone), p99(direct_concurrent));
    println!(
        "| `sh ok.sh` directly on the host | {:.2} ms | {:.2} ms | {:.1}x |",
        ms(alone),
        ms(together),
        together.as_secs_f64() / alone.as_secs_f64()
    );
}
