//! What answers before authentication: probes that say ready or not and name nothing, and
//! the first operator token, kept in a file for the server's user rather than in its log.

use super::*;
use std::process::{Command, Stdio};
use support::api::{first_token, world_of, BIN};
use support::http::server_in;

#[test]
fn probes_name_no_workspace_nor_path() {
    let tmp = tempfile::tempdir().unwrap();
    let kit = warm_kit(&tmp);
    let s = scene(world_of(server_in(tmp, &[], &WARM_ENV)), &kit);
    let addr = s.w.server.addr;
    let (status, health) = call(addr, "GET", "/healthz", "", None);
    assert_eq!((status, health), (200, Value::String("ok\n".into())));
    // (Two rounds of assessment: both workspaces are in it.)
    std::thread::sleep(cloud_harness_http::health::READY_EVERY * 2);
    let body = readyz_becomes(addr, 200);
    names_nothing(&body, &s.w, &[&s.agent_ws, &s.operator_ws]);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true);
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        [
            "store writable",
            "disk space",
            "database usable",
            "workspace mounts",
            "executor limits"
        ]
    );
    // A flood of probes is answered from the last assessment.
    let probes: Vec<_> = (0..64)
        .map(|_| std::thread::spawn(move || call(addr, "GET", "/readyz", "", None).0))
        .collect();
    for p in probes {
        assert_eq!(p.join().unwrap(), 200);
    }
}

#[test]
fn the_first_token_is_in_a_file_for_this_user_alone_not_in_the_log() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    // Something left where the file goes (a link to another file) is replaced, never written
    // through.
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::write(&elsewhere, "untouched").unwrap();
    std::os::unix::fs::symlink(&elsewhere, home.join("operator-token")).unwrap();
    // stderr is a pipe, as in a service's journal.
    let server = server_in(tmp, &[], &[("CLOUD_HARNESS_EXECUTOR", "none")]);
    let token = first_token(&home, &server.log);
    let log = server.log.lock().unwrap().clone();
    assert!(!log.contains(&token) && !log.contains("cht_"), "{log}");
    assert!(!log.contains("login?code="), "{log}");
    assert!(
        log.contains(&home.join("operator-token").display().to_string()),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
    let file = home.join("operator-token");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0], token);
    assert!(
        lines[1].starts_with(&format!("http://{}/login?code=", server.addr)),
        "{text}"
    );
    // The token is the operator's, and the link signs a browser in.
    let (status, me) = call(server.addr, "GET", "/api/v1/whoami", &token, None);
    assert_eq!(
        (status, me["role"].as_str()),
        (200, Some("operator")),
        "{me}"
    );
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http.get(lines[1]).send().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .starts_with("__Host-"));
}

#[test]
fn on_a_terminal_the_first_start_shows_the_token_too() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    // `script` gives the server a terminal for its stderr (util-linux, in every Debian).
    let command = format!("exec {BIN} serve --http 127.0.0.1:0 --no-mount");
    let mut child = Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .env("CLOUD_HARNESS_HOME", &home)
        .env("TOOLKIT_CACHE_ROOT", tmp.path().join("store"))
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .env("CLOUD_HARNESS_STANDBY_HELPERS", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut shown = String::new();
    while !shown.contains("login?code=") {
        let Some(Ok(line)) = lines.next() else { break };
        shown.push_str(&line);
        shown.push('\n');
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(home.join("operator-token")).unwrap();
    let token = text.lines().next().unwrap();
    assert!(shown.contains(token), "{shown}");
    assert!(shown.contains(text.lines().nth(1).unwrap()), "{shown}");
}
