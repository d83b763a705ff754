//! The dashboard's server time and transfer size over a library of 10,000 skills (100 bundles
//! of 100), against a real `serve --http` on loopback: the Library page (unfiltered, searched,
//! a later page), a skill's page and the Overview, each against the API's JSON answer to the
//! same search and the server's static stylesheet (its floor), interleaved, medians and p90.
//!
//! `cargo bench --bench dashboard` (`DASHBOARD_ROUNDS` to change the default of 30).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn quantile(xs: &mut [Duration], q: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let rounds: usize = std::env::var("DASHBOARD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src");
    for b in 0..100 {
        let dir = src.join(format!("kit-{b:03}"));
        for s in 0..100 {
            let skill = dir.join(format!("skill-{b:03}-{s:03}"));
            std::fs::create_dir_all(skill.join("scripts")).unwrap();
            std::fs::write(
                skill.join("SKILL.md"),
                format!("---\nname: skill-{b:03}-{s:03}\ndescription: Skill {s} of kit {b}, for topic-{}.\n---\n# Skill {s}\n\nUse it **carefully**: run `scripts/run.sh`.\n\n- one\n- two\n", (b * 100 + s) % 997),
            )
            .unwrap();
            std::fs::write(skill.join("scripts/run.sh"), "#!/bin/sh\necho run\n").unwrap();
        }
        support::warm_toolkit(&store, &dir, &format!("kit-{b:03}"));
    }
    let server = support::http::server_in(
        tmp,
        &["--auth", "none"],
        &[
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    );
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let base = format!("http://{}", server.addr);
    let get = |path: &str| {
        let t = Instant::now();
        let r = http.get(format!("{base}{path}")).send().unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        let body = r.bytes().unwrap();
        (t.elapsed(), body.len())
    };
    // The first query reads every bundle from the store; the figures are of warm queries.
    let first = get("/library").0;
    let page = String::from_utf8(
        http.get(format!("{base}/library?q=skill-042-007"))
            .send()
            .unwrap()
            .bytes()
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    let at = page.find("/skills/sha256:").expect("a skill link");
    let skill = page[at..at + 79].to_owned();
    let asked = [
        ("Library, first page", "/library".to_owned()),
        ("Library, q=topic-512", "/library?q=topic-512".to_owned()),
        ("Library, page 40", "/library?page=40".to_owned()),
        ("a skill's page", skill.clone()),
        ("Overview", "/".to_owned()),
        (
            "API JSON, q=topic-512",
            "/api/v1/skills?q=topic-512&limit=50".to_owned(),
        ),
        ("stylesheet (floor)", "/assets/app.css".to_owned()),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); asked.len()];
    let mut sizes = vec![0usize; asked.len()];
    for _ in 0..rounds {
        for (i, (_, path)) in asked.iter().enumerate() {
            let (t, n) = get(path);
            times[i].push(t);
            sizes[i] = n;
        }
    }
    let assets = get("/assets/app.css").1 + get("/assets/live.js").1;
    println!("dashboard over 10,003 skills ({rounds} rounds, interleaved; time to the last byte on loopback):");
    println!(
        "  first Library page (every bundle read): {:.1} ms",
        ms(first)
    );
    let floor = quantile(&mut times[asked.len() - 1].clone(), 0.5);
    for (i, (name, _)) in asked.iter().enumerate() {
        let (p50, p90) = (quantile(&mut times[i], 0.5), quantile(&mut times[i], 0.9));
        println!(
            "  {name:<24} p50 {:>6.2} ms  p90 {:>6.2} ms  ({:>5.1}x the stylesheet)  {:>7} bytes",
            ms(p50),
            ms(p90),
            p50.as_secs_f64() / floor.as_secs_f64(),
            sizes[i]
        );
    }
    for (name, i) in [("Library page", 0), ("skill page", 3)] {
        println!(
            "  transfer of a {name} with its assets (stylesheet, script): {:.1} KB",
            (sizes[i] + assets) as f64 / 1000.0
        );
    }
}
