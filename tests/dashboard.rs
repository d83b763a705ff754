//! The dashboard, against a real `serve --http` on loopback with a store holding a hostile
//! skill: in a real browser (`tests/dashboard/browser.py`, Playwright driving Debian's
//! chromium) and over plain HTTP for what a browser would hide.

mod support;

use serde_json::json;
use std::process::Command;
use support::api::{warm_world, World};
use support::{dir, file};

/// A SKILL.md that tries everything: a script, an image whose error handler runs, a
/// `javascript:` link, raw HTML with handlers, an iframe.
const HOSTILE: &str = "---\nname: hostile\ndescription: Tries to run in the dashboard.\n---\n# Safe heading\n\n<script>window.__pwned = 1</script>\n\n<img src=x onerror=\"window.__pwned = 2\">\n\n[click me](javascript:window.__pwned=3)\n\n<div onclick=\"window.__pwned = 4\">raw html</div>\n\n<iframe src=\"https://example.invalid/\"></iframe>\n";

fn setup() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_fs::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/hostile-kit");
    support::materialize(
        &src,
        &dir(vec![("hostile", dir(vec![("SKILL.md", file(HOSTILE))]))]),
    );
    support::warm_toolkit(&store, &src, "hostile-kit");
    warm_world(tmp)
}

fn browser_ready() -> bool {
    let python = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .status()
        .is_ok_and(|s| s.success());
    let ok = python && std::path::Path::new("/usr/bin/chromium").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "the browser tests need chromium and playwright (.ci/setup)"
        );
        eprintln!("skipped: chromium or playwright is missing");
    }
    ok
}

#[test]
fn the_dashboard_in_a_real_browser() {
    if !browser_ready() {
        return;
    }
    let w = setup();
    let base = format!("http://{}", w.server.addr);
    let (code, login) = w.cli(&["token", "login-url", "--url", &base]);
    assert_eq!(code, 0, "{login}");
    let config = json!({
        "url": base,
        "login": login.trim(),
        "chromium": "/usr/bin/chromium",
        "screenshots": std::env::var("DASHBOARD_SCREENSHOTS").ok(),
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
}

#[test]
fn pages_carry_the_csp_and_a_form_without_the_session_token_changes_nothing() {
    let w = setup();
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
    for path in ["/", "/library", "/tokens", "/audit"] {
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
            csp.contains("default-src 'none'") && !csp.contains("script-src"),
            "{path}: {csp}"
        );
        assert!(
            r.text().unwrap().contains("<nav aria-label=\"Main\">"),
            "{path}"
        );
    }
    // A form post without the session's CSRF token (or from another origin) makes no token.
    let post = |origin: &str, body: &str| {
        http.post(w.url("/tokens"))
            .header("Cookie", &cookie)
            .header("Origin", origin)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body.to_owned())
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(post(&base, "name=forged&role=operator&csrf=wrong"), 403);
    assert_eq!(
        post("http://evil.example", "name=forged&role=operator"),
        403
    );
    assert!(!w
        .op("GET", "/api/v1/tokens", None)
        .to_string()
        .contains("forged"));
    // The skill page shows the hostile SKILL.md as inert text.
    let lib = http
        .get(w.url("/library?q=hostile"))
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
    for bad in [
        "<script>window",
        "onerror=",
        "javascript:",
        "onclick=",
        "<iframe",
    ] {
        assert!(!page.contains(bad), "{bad} survived: {page}");
    }
}
