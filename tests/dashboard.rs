//! The dashboard, against a real `serve --http` on loopback with a store holding a hostile
//! skill: in a real browser (`tests/dashboard/browser.py`, Playwright driving Debian's
//! chromium) and over plain HTTP for what a browser would hide.

use crate::support;

use serde_json::{json, Value};
use std::process::Command;
use support::api::{conflicting_kits, world_with, World};
use support::{dir, file, skill, Certs, GitServer, Repo};

/// A SKILL.md that tries everything: a script, an image whose error handler runs, a
/// `javascript:` link, raw HTML with handlers, an iframe.
const HOSTILE: &str = "---\nname: hostile\ndescription: Tries to run in the dashboard.\n---\n# Safe heading\n\n<script>window.__pwned = 1</script>\n\n<img src=x onerror=\"window.__pwned = 2\">\n\n[click me](javascript:window.__pwned=3)\n\n<div onclick=\"window.__pwned = 4\">raw html</div>\n\n<iframe src=\"https://example.invalid/\"></iframe>\n";

/// A skill that breaks the Agent Skills specification five ways: its name's form, a name
/// other than its folder's, an unknown field, a Claude Code field, a link to a missing file.
const BREAKS_THE_SPEC: &str = "---\nname: deploy_helper\ndescription: Deploys the service.\nversion: 2\nargument-hint: \"[env]\"\n---\n# Deploy\n\nRun [the script](scripts/deploy.sh).\n";

/// What the scenarios work on: a server with bubblewrap executors, a store holding the hostile
/// skill and the warm toolkits of [`conflicting_kits`], and a local HTTPS git server with
/// `team/kit.git` at two commits (three skills, then a fourth).
struct Fixture {
    w: World,
    git: GitServer,
    first: String,
    second: String,
    kits: (Value, Value, Value),
    _certs: Certs,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/hostile-kit");
    support::materialize(
        &src,
        &dir(vec![
            (
                "hostile",
                dir(vec![
                    ("SKILL.md", file(HOSTILE)),
                    ("notes.html", file("<script>window.__pwned = 5</script>")),
                    ("logo.bin", support::Node::File(vec![0x89, b'P', 0, 0xff])),
                ]),
            ),
            (
                "deploy-helper",
                dir(vec![("SKILL.md", file(BREAKS_THE_SPEC))]),
            ),
        ]),
    );
    support::warm_toolkit(&store, &src, "hostile-kit");
    let kits = conflicting_kits(&tmp);
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let repo = Repo::create(&repos, "team/kit.git", false);
    // The second commit adds triage and changes lint (its SKILL.md, a script made).
    let skills = |second: bool| {
        let lint = if second {
            dir(vec![
                ("SKILL.md", file("---\nname: lint\ndescription: The lint skill.\n---\nLint the code.\n\nRun `scripts/lint.sh` on the changed files.\n")),
                ("scripts", dir(vec![("lint.sh", support::Node::Exec(b"#!/bin/sh\nexec lint \"$@\"\n".to_vec()))])),
            ])
        } else {
            skill("lint", "Lint the code.")
        };
        let mut all = vec![
            ("lint", lint),
            ("fmt", skill("fmt", "Format the code.")),
            ("review", skill("review", "Review a change.")),
        ];
        if second {
            all.push(("triage", skill("triage", "Triage an issue.")));
        }
        dir(vec![("skills", dir(all))])
    };
    let first = repo.commit(skills(false));
    let second = repo.commit(skills(true));
    // Slow enough that an import is still running when its page comes back.
    let git = GitServer::start_with(&repos, &certs, "127.0.0.1", 0.7);
    let (ca, hosts) = (
        certs.ca.display().to_string(),
        format!("{},{}", git.host(), support::WARM_HOST),
    );
    let executor = if support::executor_backend("bwrap") {
        "bwrap"
    } else {
        "none"
    };
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", executor),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", hosts.as_str()),
            ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            // The usage page shows uses a second after they are made.
            ("CLOUD_HARNESS_USAGE_FLUSH_SECONDS", "1"),
        ],
    );
    Fixture {
        w,
        git,
        first,
        second,
        kits,
        _certs: certs,
    }
}

fn browser_ready() -> bool {
    let python = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .status()
        .is_ok_and(|s| s.success());
    let mcp = Command::new("python3")
        .args(["-c", "import mcp"])
        .status()
        .is_ok_and(|s| s.success());
    let ok = python
        && mcp
        && std::path::Path::new("/usr/bin/chromium").exists()
        && support::executor_backend("bwrap");
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "the browser tests need chromium, playwright, the MCP SDK and bubblewrap (.ci/setup)"
        );
        eprintln!("skipped: chromium, playwright, the MCP SDK or bubblewrap is missing");
    }
    ok
}

#[test]
fn the_dashboard_in_a_real_browser() {
    if !browser_ready() {
        return;
    }
    let f = fixture();
    let w = &f.w;
    let base = format!("http://{}", w.server.addr);
    let (code, login) = w.cli(&["token", "login-url", "--url", &base]);
    assert_eq!(code, 0, "{login}");
    let agent = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "agent", "role": "client"})),
    );
    let config = json!({
        "url": base,
        "login": login.trim(),
        "agent": agent["token"],
        "chromium": "/usr/bin/chromium",
        "screenshots": std::env::var("DASHBOARD_SCREENSHOTS").ok(),
        "kit": f.git.url("team/kit.git"),
        "first": f.first,
        "second": f.second,
        "one": f.kits.0,
        "two": f.kits.1,
        "scripted": f.kits.2,
    });
    let path = w.server.tmp.path().join("browser.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/browser.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("dashboard: ok"), "{text}");
    // axe-core's counts, for CI's output.
    println!("{}", text.trim());
}

#[test]
fn pages_carry_the_csp_and_a_form_without_the_session_token_changes_nothing() {
    let f = fixture();
    let w = &f.w;
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Signed out, a page sends the browser to the sign-in hint.
    let r = http.get(w.url("/library")).send().unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["location"].to_str().unwrap()
        ),
        (303, "/")
    );
    let base = format!("http://{}", w.server.addr);
    let (_, login) = w.cli(&["token", "login-url", "--url", &base]);
    let r = http.get(login.trim()).send().unwrap();
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    for path in [
        "/",
        "/library",
        "/usage",
        "/usage?show=unused&days=7",
        "/imports",
        "/sets",
        "/sets/new",
        "/registry",
        "/registry/mattpocock/skills",
        "/conflicts",
        "/approvals",
        "/workspaces",
        "/audit",
        "/tokens",
    ] {
        let r = http
            .get(w.url(path))
            .header("Cookie", &cookie)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            csp.contains("default-src 'none'")
                && csp.contains("script-src 'self'")
                && csp.contains("frame-ancestors 'none'")
                && !csp.contains("unsafe"),
            "{path}: {csp}"
        );
        assert!(
            r.text().unwrap().contains("<nav aria-label=\"Main\">"),
            "{path}"
        );
    }
    // A form post without the session's CSRF token (or from another origin) makes nothing.
    let post_to = |path: &str, origin: &str, body: &str| {
        http.post(w.url(path))
            .header("Cookie", &cookie)
            .header("Origin", origin)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body.to_owned())
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    let post = |origin: &str, body: &str| post_to("/tokens", origin, body);
    assert_eq!(post(&base, "name=forged&role=operator&csrf=wrong"), 403);
    assert_eq!(
        post("http://evil.example", "name=forged&role=operator"),
        403
    );
    assert!(!w
        .op("GET", "/api/v1/tokens", None)
        .to_string()
        .contains("forged"));
    let member = format!(
        "m0.toolkit=git&m0.url={}&m0.ref={}",
        f.git.url("team/kit.git"),
        f.first
    );
    let forged = [
        ("/sets/new", format!("id=forged&action=save&{member}")),
        (
            "/imports",
            format!("kind=git&url={}", f.git.url("team/kit.git")),
        ),
        (
            "/registry",
            format!(
                "id=forged/kit&name=x&url={}&commit={}",
                f.git.url("team/kit.git"),
                f.first
            ),
        ),
        (
            "/approvals",
            format!("digest={}", "sha256:".to_owned() + &"a".repeat(64)),
        ),
        (
            "/registry/mattpocock/skills/labels",
            format!("label=forged&commit={}", f.first),
        ),
        ("/sets/team/labels", "label=forged&revision=1".to_owned()),
    ];
    for (path, body) in &forged {
        assert_eq!(
            post_to(path, &base, &format!("{body}&csrf=wrong")),
            403,
            "{path}"
        );
        assert_eq!(post_to(path, "http://evil.example", body), 403, "{path}");
    }
    assert_eq!(w.op("GET", "/api/v1/sets", None)["sets"], json!([]));
    assert_eq!(w.op("GET", "/api/v1/imports", None)["imports"], json!([]));
    assert_eq!(
        w.op("GET", "/api/v1/approvals", None)["approvals"],
        json!([])
    );
    assert!(!w
        .op("GET", "/api/v1/registry", None)
        .to_string()
        .contains("forged"));
    // The dashboard is for operators: a client token reads none of its pages (they show every
    // principal's workspaces) and cannot post a form.
    let viewer = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "viewer", "role": "client"})),
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for path in [
        "/imports",
        "/sets/new",
        "/registry",
        "/approvals",
        "/workspaces",
        "/",
        "/library",
        "/usage",
        "/conflicts",
    ] {
        let r = http.get(w.url(path)).bearer_auth(&viewer).send().unwrap();
        assert_eq!(r.status().as_u16(), 403, "{path}");
        let body = r.text().unwrap();
        assert!(body.contains("FORBIDDEN"), "{path}: {body}");
    }
    let r = http
        .post(w.url("/sets/new"))
        .bearer_auth(&viewer)
        .header("Origin", &base)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("id=by-client&action=save&{member}"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(w.op("GET", "/api/v1/sets", None)["sets"], json!([]));
    // The skill page shows the hostile SKILL.md as inert text.
    let lib = http
        .get(w.url("/library?q=tries+to+run"))
        .header("Cookie", &cookie)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let at = lib.find("/skills/sha256:").unwrap();
    let href = &lib[at..at + 79];
    let page = http
        .get(w.url(href))
        .header("Cookie", &cookie)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(page.contains("Safe heading"), "{page}");
    // (The raw SKILL.md is shown too, escaped: its markup is text there.)
    for bad in [
        "<script>window",
        "<img",
        " onerror=\"",
        "href=\"javascript:",
        " onclick=\"",
        "<iframe",
    ] {
        assert!(!page.contains(bad), "{bad} survived: {page}");
    }
    // Its files: text as plain text, binary as a download, both sandboxed; only its own.
    let get = |path: &str| {
        http.get(w.url(path))
            .header("Cookie", &cookie)
            .send()
            .unwrap()
    };
    let html = get(&format!("{href}/files/notes.html"));
    assert_eq!(html.status().as_u16(), 200);
    assert_eq!(
        html.headers()["content-type"].to_str().unwrap(),
        "text/plain; charset=utf-8"
    );
    assert!(html.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .starts_with("sandbox"));
    assert_eq!(html.text().unwrap(), "<script>window.__pwned = 5</script>");
    let bin = get(&format!("{href}/files/logo.bin"));
    assert_eq!(
        bin.headers()["content-disposition"].to_str().unwrap(),
        "attachment; filename=\"logo.bin\""
    );
    assert_eq!(bin.bytes().unwrap().as_ref(), &[0x89, b'P', 0, 0xff]);
    for missing in ["files/../SKILL.md", "files/%2e%2e/x", "files/nope"] {
        let r = get(&format!("{href}/{missing}"));
        assert_eq!(r.status().as_u16(), 404, "{missing}");
    }
    // A genuine form with a bad member is refused at the member's row, and saves nothing.
    let new = get("/sets/new").text().unwrap();
    let needle = "name=\"csrf\" value=\"";
    let at = new.find(needle).unwrap() + needle.len();
    let csrf = &new[at..at + new[at..].find('"').unwrap()];
    let r = http
        .post(w.url("/sets/new"))
        .header("Cookie", &cookie)
        .header("Origin", &base)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!(
            "csrf={csrf}&id=bad&action=save&m0.toolkit=git&m0.url={}",
            f.git.url("team/kit.git")
        ))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body = r.text().unwrap();
    assert!(
        body.matches("class=\"field-error\" role=\"alert\">members[0].ref: a git member is pinned to an exact commit")
            .count()
            == 1,
        "{body}"
    );
    assert_eq!(w.op("GET", "/api/v1/sets", None)["sets"], json!([]));
}
