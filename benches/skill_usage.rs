//! What counting skill usage costs on the paths it watches, counting on against off in the
//! same run, interleaved (the order flipped each round), medians of the rounds:
//!
//! - a warm `skills_read` over MCP, as a client sees it: two `serve --http`, one counting and
//!   one not, each read by one client over a kept-alive connection;
//! - the same in process, as the MCP layer makes it (the page from what the namespace holds,
//!   then the use counted): the count's cost alone;
//! - a read through a workspace's mount that reaches the daemon (the file's pages dropped
//!   first), on a mount that counts its loads against one that does not;
//! - a warm read through the mount (the kernel's cache answers; nothing is counted);
//! - the first read of every file of a workspace just opened: a counting mount's prewarm
//!   lists folders without reading files (a page it cached would hide the agent's read), so
//!   its first reads reach the daemon; a mount that does not count is prewarmed with them.
//!
//! `cargo bench --bench skill_usage` (the mount rows as root with /dev/fuse).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_control::skill_usage::{self, Source};
use cloud_harness_executor::{Kind, Settings};
use cloud_harness_skills::namespace::Reach;
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, Workspaces};
use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::api::{world_of, World};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");
const SKILLS: usize = 50;
const ROUNDS: usize = 15;
const READS: usize = 4000;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn range(xs: &[f64]) -> (f64, f64) {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(0.0, f64::max);
    (lo, hi)
}

/// Every file of the mount at `root`: each skill's `SKILL.md` and its notes.
fn files(root: &Path) -> Vec<PathBuf> {
    (0..SKILLS)
        .flat_map(|i| {
            let skill = root.join(format!("kit-skill-{i:03}"));
            [skill.join("SKILL.md"), skill.join("references/notes.md")]
        })
        .collect()
}

/// Reads each file whole; with `drop`, its cached pages are dropped first, so the read
/// reaches the daemon. Microseconds per file.
fn read_all(files: &[PathBuf], drop: bool) -> f64 {
    let mut buf = vec![0u8; 16 << 10];
    let t = Instant::now();
    for f in files {
        let mut file = std::fs::File::open(f).unwrap();
        if drop {
            nix::fcntl::posix_fadvise(
                &file,
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
            .unwrap();
        }
        while file.read(&mut buf).unwrap() > 0 {}
    }
    t.elapsed().as_secs_f64() * 1e6 / files.len() as f64
}

fn mount_uses() -> u64 {
    skill_usage::take()
        .iter()
        .filter(|(k, _)| k.source == Source::Mount)
        .map(|(_, t)| t.uses)
        .sum()
}

/// `skills_read` of `skill`'s SKILL.md over MCP, `n` times on one connection: microseconds
/// per call.
fn mcp_reads(w: &World, session: &str, ws: &str, skill: &str, n: usize) -> f64 {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "skills_read", "arguments": {"workspace": ws, "skill": skill, "path": "SKILL.md"}}})
    .to_string();
    let t = Instant::now();
    for _ in 0..n {
        let answer = w
            .http
            .post(w.url("/mcp"))
            .bearer_auth(&w.operator)
            .header("Mcp-Session-Id", session)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2025-11-25")
            .body(body.clone())
            .send()
            .unwrap()
            .text()
            .unwrap();
        assert!(answer.contains("\"isError\":false"), "{answer}");
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// A server counting uses or not, a workspace of the built-in tier on it, and a skill of it.
fn mcp_server(counting: bool) -> (World, String, String, String) {
    let w = world_of(support::http::server_in(
        tempfile::tempdir().unwrap(),
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_USAGE", if counting { "on" } else { "off" }),
            // One client reads as fast as it can: past the default quota of 1,000 a second.
            ("CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND", "1000000"),
        ],
    ));
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "bench"}),
    );
    let out = &opened["structuredContent"];
    let ws = out["workspace"].as_str().unwrap().to_owned();
    let skill = out["skills"][0]["name"].as_str().unwrap().to_owned();
    (w, session, ws, skill)
}

fn main() {
    // Over MCP first, before this process's own workspaces take memory and threads.
    let servers = [mcp_server(true), mcp_server(false)];
    for (w, session, ws, skill) in &servers {
        mcp_reads(w, session, ws, skill, 500);
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for counting in [round % 2 == 0, round % 2 == 1] {
            let (w, session, ws, skill) = &servers[usize::from(!counting)];
            let us = mcp_reads(w, session, ws, skill, 1000);
            if counting {
                on.push(us)
            } else {
                off.push(us)
            }
        }
    }
    drop(servers);
    let mut rows = vec![(
        "warm `skills_read` of a SKILL.md over MCP (HTTP, one client)",
        on,
        off,
    )];

    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    for i in 0..SKILLS {
        let skill = src.join(format!("kit-skill-{i:03}"));
        std::fs::create_dir_all(skill.join("references")).unwrap();
        std::fs::write(
            skill.join("SKILL.md"),
            format!(
                "---\nname: kit-skill-{i:03}\ndescription: Skill {i}.\n---\n{}\n",
                "Body. ".repeat(300)
            ),
        )
        .unwrap();
        std::fs::write(skill.join("references/notes.md"), "notes ".repeat(600)).unwrap();
    }
    let kit = support::warm_toolkit(&store, &src, "kit");
    let mounting = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
    let workspaces = Workspaces::with_executors(
        tmp.path().join("home"),
        support::warm_provisioner(&store),
        mounting,
        Settings::with_kind(Kind::Host),
    )
    .unwrap()
    .prewarming(BIN.into());
    let open = |key: &str, counting: bool| {
        skill_usage::set_enabled(counting);
        let opened = workspaces
            .open(OpenRequest {
                repository_url: None,
                idempotency_key: key.into(),
                toolkits: vec![kit.clone()],
                allow_toolkit_workspace_changes: false,
                idle_pause: false,
            })
            .unwrap();
        skill_usage::set_enabled(true);
        let ws = workspaces
            .get(opened["workspace"].as_str().unwrap())
            .unwrap();
        let mount = opened["skillsMount"].as_str().map(PathBuf::from);
        (ws, mount)
    };

    // skills_read, warm: what the MCP layer does for each call.
    let (ws, counting_mount) = open("counting", true);
    let names: Vec<String> = (0..SKILLS).map(|i| format!("kit-skill-{i:03}")).collect();
    let reads = |counting: bool| -> f64 {
        skill_usage::set_enabled(counting);
        let t = Instant::now();
        for i in 0..READS {
            let skill = &names[i % SKILLS];
            let started = Instant::now();
            let page = ws.read_reaching(skill, "SKILL.md", 0, 64 << 10, Reach::Held);
            // As the MCP layer does: what the namespace does not hold yet, from the store.
            let page = match page.unwrap() {
                Some(page) => page,
                None => ws.read(skill, "SKILL.md", 0, 64 << 10).unwrap(),
            };
            ws.used(
                Source::Read,
                "token:bench",
                skill,
                &page.path,
                false,
                started.elapsed(),
            );
        }
        skill_usage::set_enabled(true);
        t.elapsed().as_secs_f64() * 1e6 / READS as f64
    };
    for _ in 0..2 {
        reads(true);
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for counting in [round % 2 == 0, round % 2 == 1] {
            let us = reads(counting);
            if counting {
                on.push(us)
            } else {
                off.push(us)
            }
        }
    }
    skill_usage::take();
    rows.push(("warm `skills_read` of a SKILL.md (in process)", on, off));

    if let Some(counting_mount) = counting_mount {
        let (quiet_ws, quiet_mount) = open("quiet", false);
        let quiet_mount = quiet_mount.unwrap();
        // The prewarms end well within this (100 files, a few ms each).
        std::thread::sleep(Duration::from_secs(2));
        let (counted, quiet) = (files(&counting_mount), files(&quiet_mount));
        read_all(&counted, true);
        read_all(&quiet, true);
        mount_uses();
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            for counting in [round % 2 == 0, round % 2 == 1] {
                match counting {
                    true => on.push(read_all(&counted, true)),
                    false => off.push(read_all(&quiet, true)),
                }
            }
        }
        // Each read reached the daemon and was counted, on the counting mount only.
        assert_eq!(mount_uses(), (ROUNDS * counted.len()) as u64);
        rows.push((
            "mount read reaching the daemon (pages dropped), 4 KiB",
            on,
            off,
        ));
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            for counting in [round % 2 == 0, round % 2 == 1] {
                match counting {
                    true => on.push(read_all(&counted, false)),
                    false => off.push(read_all(&quiet, false)),
                }
            }
        }
        assert_eq!(mount_uses(), 0, "warm reads are the kernel's");
        rows.push(("mount read, warm (the kernel's cache)", on, off));

        // The first reads of a workspace just opened, once its prewarm ended.
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for round in 0..7 {
            for counting in [round % 2 == 0, round % 2 == 1] {
                let (ws, mount) = open(&format!("first-{round}-{counting}"), counting);
                std::thread::sleep(Duration::from_secs(1));
                let us = read_all(&files(&mount.unwrap()), false);
                if counting {
                    on.push(us)
                } else {
                    off.push(us)
                }
                workspaces.close(&ws.id).unwrap();
            }
        }
        mount_uses();
        rows.push(("first read of each file after an open (prewarmed)", on, off));
        workspaces.close(&quiet_ws.id).unwrap();
    } else {
        println!("(not root or no /dev/fuse: no mount rows)");
    }

    workspaces.close(&ws.id).unwrap();
    println!("Skill usage counting on against off, {ROUNDS} rounds interleaved, medians (range)");
    println!("| path | counting on | counting off | ratio |");
    println!("|---|---|---|---|");
    for (what, on, off) in rows {
        let ((on_lo, on_hi), (off_lo, off_hi)) = (range(&on), range(&off));
        let (on, off) = (median(on), median(off));
        println!(
            "| {what} | {on:.2} µs ({on_lo:.2}-{on_hi:.2}) | {off:.2} µs ({off_lo:.2}-{off_hi:.2}) | **{:.3}x** |",
            on / off
        );
    }
}
