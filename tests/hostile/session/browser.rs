//! The browser session: its cookie, the one origin its writes come from, its CSRF token on
//! every write (sign-out too), and requests that name no host.

use super::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use support::api::{world_of, BIN};
use support::http::server_in;

/// A signed-in browser session: its `Set-Cookie`, the cookie to send, its CSRF token.
fn sign_in(w: &World) -> (String, String, String) {
    let origin = format!("http://{}", w.server.addr);
    let (code, link) = w.cli(&["token", "login-url", "--url", &origin]);
    assert_eq!(code, 0, "{link}");
    let r = w.http.get(link.trim()).send().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let set_cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    let me = json_of(
        w.http
            .get(w.url("/api/v1/whoami"))
            .header("Cookie", &cookie)
            .send()
            .unwrap(),
    );
    let csrf = me["csrfToken"].as_str().unwrap().to_owned();
    (set_cookie, cookie, csrf)
}

/// One request written by hand (so that any header may be missing); the whole answer.
fn by_hand(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_browser_session_writes_only_from_the_dashboard_s_own_origin_with_its_csrf_token() {
    let w = support::api::world();
    let addr = w.server.addr;
    let origin = format!("http://{addr}");
    let (set_cookie, cookie, csrf) = sign_in(&w);
    // The cookie: __Host- (Secure, this host alone, every path), HttpOnly, SameSite=Strict.
    let flags: Vec<&str> = set_cookie.split(';').map(str::trim).collect();
    assert!(flags[0].starts_with("__Host-ch_session="), "{set_cookie}");
    for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(flags.contains(&flag), "{flag} missing: {set_cookie}");
    }
    assert!(!set_cookie.contains("Domain"), "{set_cookie}");

    let write = |origin: Option<&str>, csrf: Option<&str>, name: &str| {
        let mut r = w
            .http
            .post(w.url("/api/v1/tokens"))
            .header("Cookie", &cookie)
            .json_body(&json!({"name": name, "role": "client"}));
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        if let Some(c) = csrf {
            r = r.header("X-CSRF-Token", c);
        }
        let r = r.send().unwrap();
        let status = r.status().as_u16();
        (status, json_of(r))
    };
    // A page on another loopback port (or the same server named otherwise) is another
    // origin: refused, with the right token and all.
    let other_port = format!("http://127.0.0.1:{}", addr.port() + 1);
    let other_name = format!("http://localhost:{}", addr.port());
    for o in [
        other_port.as_str(),
        &other_name,
        "https://127.0.0.1",
        "null",
    ] {
        let (status, v) = write(Some(o), Some(&csrf), "from-elsewhere");
        assert_eq!(
            (status, v["code"].as_str()),
            (403, Some("FORBIDDEN")),
            "{o}: {v}"
        );
    }
    // A CSRF token that differs in its last character, or none: refused.
    let mut wrong = csrf.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(write(Some(&origin), Some(&wrong), "mismatch").0, 403);
    assert_eq!(write(Some(&origin), None, "none").0, 403);
    assert_eq!(write(None, Some(&csrf), "no-origin").0, 403);
    let made = w.op("GET", "/api/v1/tokens", None).to_string();
    for name in ["from-elsewhere", "mismatch", "none", "no-origin"] {
        assert!(
            !made.contains(&format!("\"{name}\"")),
            "{name} was made: {made}"
        );
    }
    // From its own origin with its token: made.
    assert_eq!(
        write(Some(&origin), Some(&csrf), "from-the-dashboard").0,
        201
    );
    // A bearer client is no browser: another loopback port's Origin is taken as before.
    let (status, v) = w
        .http
        .post(w.url("/api/v1/tokens"))
        .bearer_auth(&w.operator)
        .header("Origin", &other_port)
        .json_body(&json!({"name": "by-bearer", "role": "client"}))
        .send()
        .map(|r| (r.status().as_u16(), r.text().unwrap()))
        .unwrap();
    assert_eq!(status, 201, "{v}");

    // A form posts its token as a field: a wrong one is refused before any handler runs, the
    // right one goes through.
    let form = |body: String| {
        w.http
            .post(w.url("/tokens"))
            .header("Cookie", &cookie)
            .header("Origin", &origin)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(
        form(format!("csrf={wrong}&name=form-forged&role=client")),
        403
    );
    assert_eq!(form(format!("csrf={csrf}&name=form-made&role=client")), 200);
    let made = w.op("GET", "/api/v1/tokens", None).to_string();
    assert!(
        !made.contains("form-forged") && made.contains("form-made"),
        "{made}"
    );

    // Signing out is a write like any other: without the token, or from elsewhere, refused
    // and the session lives on.
    let logout = |origin: &str, csrf: Option<&str>| {
        let mut r = w
            .http
            .post(w.url("/logout"))
            .header("Cookie", &cookie)
            .header("Origin", origin);
        if let Some(c) = csrf {
            r = r.header("X-CSRF-Token", c);
        }
        r.send().unwrap().status().as_u16()
    };
    let signed_in = || {
        w.http
            .get(w.url("/api/v1/whoami"))
            .header("Cookie", &cookie)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(logout(&origin, None), 403);
    assert_eq!(logout(&origin, Some(&wrong)), 403);
    assert_eq!(logout(&other_port, Some(&csrf)), 403);
    assert_eq!(signed_in(), 200);
    assert_eq!(logout(&origin, Some(&csrf)), 303);
    assert_eq!(signed_in(), 401);
}

#[test]
fn a_request_without_a_host_is_refused_whatever_it_carries() {
    let w = support::api::world();
    let addr = w.server.addr;
    let (_, cookie, csrf) = sign_in(&w);
    let body = json!({"name": "hostless", "role": "client"}).to_string();
    let requests = [
        "GET /healthz HTTP/1.0\r\n\r\n".to_owned(),
        format!(
            "GET /api/v1/whoami HTTP/1.0\r\nAuthorization: Bearer {}\r\n\r\n",
            w.operator
        ),
        format!(
            "POST /api/v1/tokens HTTP/1.0\r\nCookie: {cookie}\r\nX-CSRF-Token: {csrf}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    ];
    for request in &requests {
        let answer = by_hand(addr, request);
        assert!(
            answer.starts_with("HTTP/1.0 400") || answer.starts_with("HTTP/1.1 400"),
            "{answer}"
        );
        assert!(
            answer.contains("INVALID_ARGUMENT") && answer.contains("Host"),
            "{answer}"
        );
    }
    assert!(!w
        .op("GET", "/api/v1/tokens", None)
        .to_string()
        .contains("hostless"));
    // With one, the same probe answers.
    let answer = by_hand(addr, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
}

#[test]
fn behind_a_proxy_a_browser_writes_from_the_public_origin_only() {
    let public = "https://harness.example.test";
    let w = world_of(server_in(
        tempfile::tempdir().unwrap(),
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN", public),
        ],
    ));
    let (_, cookie, csrf) = sign_in(&w);
    let write = |host: &str, origin: &str, name: &str| {
        w.http
            .post(w.url("/api/v1/tokens"))
            .header("Host", host)
            .header("Cookie", &cookie)
            .header("Origin", origin)
            .header("X-CSRF-Token", &csrf)
            .json_body(&json!({"name": name, "role": "client"}))
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    let direct = w.server.addr.to_string();
    // Reached directly, the server's own address is not where the dashboard is served from.
    assert_eq!(write(&direct, &format!("http://{direct}"), "direct"), 403);
    assert_eq!(
        write(
            "harness.example.test",
            "http://harness.example.test",
            "plain"
        ),
        403
    );
    // Through the proxy (which passes the Host on), from the public origin: taken.
    assert_eq!(write("harness.example.test", public, "proxied"), 201);
    // A public origin that is not one stops the server before it serves.
    let other = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--no-mount"])
        .env("CLOUD_HARNESS_HOME", other.path())
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .env(
            "CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN",
            "https://harness.example.test/dashboard",
        )
        .output()
        .unwrap();
    let (code, text) = support::code_and_output(out);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("http.public_origin") && text.contains("INVALID_ARGUMENT"),
        "{text}"
    );
}
