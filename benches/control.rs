//! The control plane's figures: the library query over 10,000 skills (100 bundles of 100)
//! against `grep -ril` over the same SKILL.md files; `workspace_open` of a warm 3-toolkit set
//! against the same three toolkits listed directly; and the same three toolkits opened on a
//! server whose trust policy requires a signature of each against one without a policy, with
//! the check alone timed (its first verification, then remembered). Runs interleaved, medians
//! reported.
//!
//! `cargo bench --bench control` (`CONTROL_ROUNDS` to change the default of 15).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_workspace::library::{Library, Search};
use cloud_harness_workspace::{OpenRequest, Workspaces};
use std::process::Command;
use std::time::{Duration, Instant};

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::var("CONTROL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src");
    let mut specs = Vec::new();
    for b in 0..100 {
        let dir = src.join(format!("kit-{b:03}"));
        for s in 0..100 {
            let skill = dir.join(format!("skill-{b:03}-{s:03}"));
            std::fs::create_dir_all(&skill).unwrap();
            std::fs::write(
                skill.join("SKILL.md"),
                format!("---\nname: skill-{b:03}-{s:03}\ndescription: Skill {s} of kit {b}, for topic-{}.\n---\nBody.\n", (b * 100 + s) % 997),
            )
            .unwrap();
        }
        specs.push(support::warm_toolkit(&store, &dir, &format!("kit-{b:03}")));
    }

    let library = Library::default();
    let cold = Instant::now();
    let (_, total) = library
        .search(
            &store,
            &Search {
                limit: 50,
                ..Search::default()
            },
        )
        .unwrap();
    let cold = cold.elapsed();
    assert_eq!(total, 10_003, "10,000 skills and the built-in three");
    let queries = [
        "",
        "topic-512",
        "kit 42",
        "skill-099-099",
        "nothing-matches-this",
    ];
    let mut lib: Vec<Vec<Duration>> = vec![Vec::new(); queries.len()];
    let mut grep: Vec<Duration> = Vec::new();
    for _ in 0..rounds {
        for (i, q) in queries.iter().enumerate() {
            let t = Instant::now();
            let search = Search {
                text: Some(q.to_string()),
                limit: 50,
                ..Search::default()
            };
            std::hint::black_box(library.search(&store, &search).unwrap());
            lib[i].push(t.elapsed());
        }
        let t = Instant::now();
        let out = Command::new("grep")
            .args(["-ril", "--include=SKILL.md", "topic-512"])
            .arg(&src)
            .output()
            .unwrap();
        grep.push(t.elapsed());
        assert!(!out.stdout.is_empty());
    }
    let grep = median(grep);
    println!("library over 10,003 skills ({rounds} rounds, medians; a page of 50):");
    println!(
        "  first query (every bundle read from the store): {:.1} ms",
        ms(cold)
    );
    for (q, xs) in queries.iter().zip(lib) {
        let m = median(xs);
        println!(
            "  q={q:<22} {:>6.2} ms  ({:.2}x `grep -ril` of the same SKILL.md files, {:.2} ms)",
            ms(m),
            m.as_secs_f64() / grep.as_secs_f64(),
            ms(grep)
        );
    }

    // A warm 3-toolkit set against the same toolkits listed directly.
    let home = tmp.path().join("home");
    let workspaces = Workspaces::with_executors(
        home,
        support::warm_provisioner(&store),
        false,
        cloud_harness_executor::Settings::with_kind(cloud_harness_executor::Kind::Host),
    )
    .unwrap();
    let trio: Vec<serde_json::Value> = specs[..3]
        .iter()
        .map(|s| serde_json::to_value(s).unwrap())
        .collect();
    cloud_harness_curation::sets::create(
        workspaces.db(),
        workspaces.hosts(),
        "trio",
        "",
        &trio,
        Default::default(),
        "bench",
    )
    .unwrap();
    let set = cloud_harness_control::toolkit::spec_from_value(
        serde_json::json!({"kind": "set", "id": "trio"}),
    )
    .unwrap();
    let (mut by_set, mut direct) = (Vec::new(), Vec::new());
    for r in 0..rounds + 1 {
        for (kind, toolkits) in [("set", vec![set.clone()]), ("direct", specs[..3].to_vec())] {
            let t = Instant::now();
            let opened = workspaces
                .open(OpenRequest {
                    repository_url: None,
                    idempotency_key: format!("{kind}-{r}"),
                    toolkits,
                    allow_toolkit_workspace_changes: false,
                    idle_pause: true,
                })
                .unwrap();
            let took = t.elapsed();
            workspaces
                .close(opened["workspace"].as_str().unwrap())
                .unwrap();
            // The first round warms the process (its caches, the database's pages).
            if r > 0 {
                if kind == "set" {
                    by_set.push(took)
                } else {
                    direct.push(took)
                }
            }
        }
    }
    let (s, d) = (median(by_set), median(direct));
    println!("workspace_open of a warm 3-toolkit set ({rounds} rounds, interleaved, medians; no mount, host executor):");
    println!(
        "  as a set {:.1} ms, listed directly {:.1} ms: {:.2}x",
        ms(s),
        ms(d),
        s.as_secs_f64() / d.as_secs_f64()
    );
    signatures(&tmp, &store, &workspaces, &specs[..3], rounds);
}

/// `cmd` with `input` on its standard input; its standard output.
fn piped(cmd: &mut Command, input: &str) -> String {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// The trust policy's cost: warm opens of `specs` on `plain` (no policy) and on a second
/// server of the same store whose policy requires an Ed25519 signature of each, interleaved;
/// then the check of one toolkit alone, the first time (the signature verified) and again
/// (remembered).
fn signatures(
    tmp: &tempfile::TempDir,
    store: &cloud_harness_store::cas::Store,
    plain: &Workspaces,
    specs: &[cloud_harness_control::toolkit::ToolkitSpec],
    rounds: usize,
) {
    use cloud_harness_control::signatures::policy::Policy;
    use cloud_harness_control::signatures::stored;
    use cloud_harness_control::signatures::verdict::{judge, Status};
    use cloud_harness_control::signatures::Subject;
    let key = tmp.path().join("release");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "release", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(made.success(), "ssh-keygen (openssh-client) is installed");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let policy_file = tmp.path().join("trust.toml");
    std::fs::write(
        &policy_file,
        format!(
            "[[scope]]\ntoolkits = [\"*\"]\nkeys = [{:?}]\nmode = \"require\"\n",
            public.trim()
        ),
    )
    .unwrap();
    std::env::set_var("CLOUD_HARNESS_TRUST_POLICY", &policy_file);
    let signed = Workspaces::with_executors(
        tmp.path().join("home-signed"),
        support::warm_provisioner(store),
        false,
        cloud_harness_executor::Settings::with_kind(cloud_harness_executor::Kind::Host),
    )
    .unwrap();
    std::env::remove_var("CLOUD_HARNESS_TRUST_POLICY");
    let open = |ws: &Workspaces, key: String| {
        let t = Instant::now();
        let opened = ws
            .open(OpenRequest {
                repository_url: None,
                idempotency_key: key,
                toolkits: specs.to_vec(),
                allow_toolkit_workspace_changes: false,
                idle_pause: true,
            })
            .unwrap();
        let took = t.elapsed();
        ws.close(opened["workspace"].as_str().unwrap()).unwrap();
        (took, opened)
    };
    // Each toolkit's bundle signed in the owner tier, as `cloud-harness signature sign` does.
    let (_, first) = open(plain, "sign-0".into());
    let mut subjects = Vec::new();
    for t in first["toolkits"].as_array().unwrap() {
        let (url, commit, bundle) = (
            t["url"].as_str().unwrap().to_owned(),
            t["commit"].as_str().unwrap().to_owned(),
            t["bundle"].as_str().unwrap().to_owned(),
        );
        let on = Subject {
            url: &url,
            commit: &commit,
            bundle: &bundle,
            tier: "owner",
        };
        let text = piped(
            Command::new("ssh-keygen")
                .args(["-q", "-Y", "sign", "-n", "cloud-harness-bundle", "-f"])
                .arg(&key),
            &on.message(),
        );
        stored::add(signed.db(), on, &text, "bench").unwrap();
        subjects.push((url, commit, bundle));
    }
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for r in 0..rounds + 1 {
        let (a, _) = open(plain, format!("plain-{r}"));
        let (b, opened) = open(&signed, format!("signed-{r}"));
        for t in opened["toolkits"].as_array().unwrap() {
            assert_eq!(t["signature"]["status"], "verified", "{opened}");
        }
        if r > 0 {
            without.push(a);
            with.push(b);
        }
    }
    let (a, b) = (median(without), median(with));
    println!("workspace_open of 3 warm toolkits, each signed and required by the trust policy ({rounds} rounds, interleaved, medians):");
    println!(
        "  with the policy {:.2} ms, without {:.2} ms: {:.3}x, {:+.3} ms",
        ms(b),
        ms(a),
        b.as_secs_f64() / a.as_secs_f64(),
        ms(b) - ms(a)
    );
    // The check of one toolkit alone: its signatures read from the database and judged.
    let policy = Policy::read(&policy_file).unwrap();
    let (url, commit, bundle) = &subjects[0];
    let on = Subject {
        url,
        commit,
        bundle,
        tier: "owner",
    };
    let kept = stored::of_subject(signed.db(), on).unwrap();
    // The verification itself, as the first check of a signature not seen before does it.
    let parsed = cloud_harness_control::signatures::Signed::parse(&kept[0].signature).unwrap();
    let message = on.message();
    let mut verifying = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        assert!(parsed.verifies(&message));
        verifying.push(t.elapsed());
    }
    let first = median(verifying);
    let mut again = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        let kept = stored::of_subject(signed.db(), on).unwrap();
        assert_eq!(judge(&policy, on, &kept).status, Status::Verified);
        again.push(t.elapsed());
    }
    println!(
        "  the check of one toolkit: its signature's verification {:.3} ms (the first check's; median of 100), the check remembered {:.3} ms (median of 1,000; the database read included)",
        ms(first),
        ms(median(again))
    );
}
