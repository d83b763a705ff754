//! Skills as MCP resources and the MCP Skills extension (SEP-2640), as a raw HTTP client sees
//! them, and the notification a bound session gets when a live tier changes them.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::http::{answer_of, legacy_session, raw, server};

/// The MCP Skills extension (SEP-2640) as a client sees it: the capability, `skills/list` and
/// `skills/get` entries whose manifests match what `resources/read` returns byte for byte,
/// `resources/list` and the template, and -32602 for what the server does not serve.
#[test]
fn the_skills_extension_lists_skills_whose_manifests_match_their_files() {
    use coreutils::sha256_hex;
    let s = server(&[]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let capabilities = answer_of(&raw(s.addr, init, &[]))["result"]["capabilities"].clone();
    assert!(
        capabilities["extensions"]["io.modelcontextprotocol/skills"].is_object(),
        "{capabilities}"
    );
    assert_eq!(
        capabilities["extensions"]["io.modelcontextprotocol/skills"]["directoryRead"], true,
        "{capabilities}"
    );
    assert!(capabilities["resources"].is_object(), "{capabilities}");
    let session = legacy_session(s.addr);
    let call = |id: u32, method: &str, params: serde_json::Value| {
        let body =
            serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        answer_of(&raw(
            s.addr,
            &body.to_string(),
            &[("Mcp-Session-Id", &session)],
        ))
    };
    let opened = call(
        2,
        "tools/call",
        serde_json::json!({ "name": "workspace_open", "arguments": { "idempotencyKey": "skills-ext" } }),
    );
    let ws = opened["result"]["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();

    let listed = call(3, "skills/list", serde_json::json!({}));
    let skills = listed["result"]["skills"].as_array().unwrap().clone();
    let names: Vec<&str> = skills
        .iter()
        .map(|e| e["frontmatter"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cloud-harness-conflicts",
            "cloud-harness-skills",
            "cloud-harness-toolkits"
        ],
        "{listed}"
    );
    assert_eq!(listed["result"]["ttlMs"], 0);
    for entry in &skills {
        let name = entry["frontmatter"]["name"].as_str().unwrap();
        assert_eq!(entry["uri"], format!("skill://{ws}/{name}/SKILL.md"));
        assert_eq!(
            entry["frontmatter"]["license"], "Apache-2.0",
            "front matter as written"
        );
        // skills/get gives the same entry.
        let got = call(4, "skills/get", serde_json::json!({ "uri": entry["uri"] }));
        assert_eq!(&got["result"]["skill"], entry);
        for file in entry["resources"].as_array().unwrap() {
            let read = call(
                5,
                "resources/read",
                serde_json::json!({ "uri": file["uri"] }),
            );
            let text = read["result"]["contents"][0]["text"].as_str().unwrap();
            assert_eq!(text.len() as u64, file["size"].as_u64().unwrap(), "{file}");
            assert_eq!(
                format!("sha256:{}", sha256_hex(text.as_bytes())),
                file["digest"],
                "{file}"
            );
        }
    }
    let resources = call(6, "resources/list", serde_json::json!({}));
    let uris: Vec<&str> = resources["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert!(
        uris.contains(&format!("skill://{ws}/cloud-harness-skills/SKILL.md").as_str()),
        "{resources}"
    );
    let templates = call(7, "resources/templates/list", serde_json::json!({}));
    assert_eq!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"],
        "skill://{workspace}/{skill}/{+path}"
    );
    // resources/directory/read: a skill's folder and its subfolder, children by name, a
    // folder as a directory resource.
    let children = |uri: String| {
        let read = call(
            9,
            "resources/directory/read",
            serde_json::json!({ "uri": uri }),
        );
        read["result"]["resources"]
            .as_array()
            .unwrap_or_else(|| panic!("{read}"))
            .iter()
            .map(|r| {
                (
                    r["uri"].as_str().unwrap().to_owned(),
                    r["mimeType"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let root = format!("skill://{ws}/cloud-harness-conflicts");
    assert_eq!(
        children(root.clone()),
        [
            (format!("{root}/SKILL.md"), "text/markdown".to_owned()),
            (format!("{root}/references"), "inode/directory".to_owned()),
        ]
    );
    assert_eq!(
        children(format!("{root}/references")),
        [(
            format!("{root}/references/conflict-error.md"),
            "text/markdown".to_owned()
        )]
    );
    // What is not served is -32602.
    for (method, uri) in [
        ("resources/directory/read", format!("{root}/SKILL.md")),
        ("resources/directory/read", format!("{root}/missing")),
        ("resources/directory/read", format!("{root}/references/")),
        (
            "resources/directory/read",
            format!("{root}/../cloud-harness-skills"),
        ),
        (
            "resources/directory/read",
            "skill://ws_nope/cloud-harness-skills".to_owned(),
        ),
        ("skills/get", format!("skill://{ws}/no-such-skill/SKILL.md")),
        (
            "skills/get",
            "skill://ws_nope/cloud-harness-skills/SKILL.md".to_owned(),
        ),
        (
            "resources/read",
            format!("skill://{ws}/cloud-harness-skills/missing.md"),
        ),
        ("resources/read", "file:///etc/passwd".to_owned()),
    ] {
        let refused = call(8, method, serde_json::json!({ "uri": uri }));
        assert_eq!(
            refused["error"]["code"], -32602,
            "{method} {uri}: {refused}"
        );
    }
}

/// SHA-256 by `sha256sum`, independent of the harness's own hashing.
mod coreutils {
    pub fn sha256_hex(bytes: &[u8]) -> String {
        use std::io::Write;
        let mut child = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    }
}

/// A session that opened a workspace hears when a live tier changes what it serves:
/// `notifications/resources/list_changed` on its event stream, promptly.
#[test]
fn a_live_change_is_announced_to_the_session_bound_to_the_workspace() {
    let s = server(&[]);
    let session = legacy_session(s.addr);
    let open = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"workspace_open","arguments":{"idempotencyKey":"live"}}}"#;
    let opened = answer_of(&raw(s.addr, open, &[("Mcp-Session-Id", &session)]));
    let ws = opened["result"]["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    // The session's stream of server messages.
    let mut events = TcpStream::connect(s.addr).unwrap();
    write!(
        events,
        "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n\r\n"
    )
    .unwrap();
    events
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // A skill appears in the working tree (staged, then renamed into place whole).
    let repo = s.tmp.path().join("home/workspaces").join(&ws).join("repo");
    let staged = repo.join("staged/fresh");
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(
        staged.join("SKILL.md"),
        "---\nname: fresh\ndescription: New.\n---\n",
    )
    .unwrap();
    std::fs::create_dir_all(repo.join(".agents/skills")).unwrap();
    let changed = Instant::now();
    std::fs::rename(&staged, repo.join(".agents/skills/fresh")).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Ok(n) = events.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
        }
        if String::from_utf8_lossy(&seen).contains("notifications/resources/list_changed") {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(2),
            "no change announced: {}",
            String::from_utf8_lossy(&seen)
        );
    }
    eprintln!("announced {:?} after the change", changed.elapsed());
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"skills/list"}"#;
    let listed = answer_of(&raw(s.addr, list, &[("Mcp-Session-Id", &session)]));
    assert!(
        listed
            .to_string()
            .contains(&format!("skill://{ws}/fresh/SKILL.md")),
        "{listed}"
    );
}

/// Bytes the process `pid` has asked the kernel to read, in all (`rchar`).
fn bytes_read(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// A skill holding a file of 1 MiB and ten links to it: its manifest in the skills extension
/// gives each link the file's digest and size (what a read of it returns), taken from the
/// trees; listing it reads none of the file (each link's listing once read and hashed the
/// whole file it leads to: 20,000 links to one 32 MiB file made one listing read 640 GB).
#[test]
fn a_skill_s_links_are_listed_without_reading_what_they_lead_to() {
    use coreutils::sha256_hex;
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let skill = tmp.path().join("src/kit/linked");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: linked\ndescription: Links to one file.\n---\nbody\n",
    )
    .unwrap();
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(skill.join("big.bin"), &big).unwrap();
    for i in 0..10 {
        std::os::unix::fs::symlink("big.bin", skill.join(format!("link-{i}.bin"))).unwrap();
    }
    let kit = support::warm_toolkit(&store, &tmp.path().join("src/kit"), "kit");
    let s = support::http::server_in(
        tmp,
        &["--auth", "none"],
        &[
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
        ],
    );
    let session = legacy_session(s.addr);
    let call = |id: u32, method: &str, params: serde_json::Value| {
        let body =
            serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        answer_of(&raw(
            s.addr,
            &body.to_string(),
            &[("Mcp-Session-Id", &session)],
        ))
    };
    let opened = call(
        2,
        "tools/call",
        serde_json::json!({ "name": "workspace_open", "arguments": { "idempotencyKey": "links", "toolkits": [kit] } }),
    );
    assert_ne!(opened["result"]["isError"], true, "{opened}");
    call(3, "skills/list", serde_json::json!({}));
    let before = bytes_read(s.child.id());
    let listed = call(4, "skills/list", serde_json::json!({}));
    let read = bytes_read(s.child.id()) - before;
    let entry = listed["result"]["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["frontmatter"]["name"] == "linked")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    let digest = format!("sha256:{}", sha256_hex(&big));
    let links: Vec<&serde_json::Value> = entry["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["uri"].as_str().unwrap().contains("/link-"))
        .collect();
    assert_eq!(links.len(), 10, "{entry}");
    for link in links {
        assert_eq!(link["digest"], digest.as_str(), "{link}");
        assert_eq!(link["size"], big.len(), "{link}");
    }
    assert!(
        read < big.len() as u64,
        "listing read {read} bytes: the file a link leads to was read"
    );
}
