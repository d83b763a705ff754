//! The decoders of tool-call arguments and toolkit specs: any JSON gives a decoded call or a
//! typed error naming what to fix, never a panic; a decoded toolkit spec resolves or is refused.
#![no_main]

use cloud_harness_mcp::call::{decode, Call};
use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::toolkit;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::sync::LazyLock;

const TOOLS: [&str; 6] = [
    "workspace_open",
    "workspace_close",
    "skills_list",
    "skills_read",
    "skills_run",
    "unknown",
];

static HOSTS: LazyLock<HostPolicy> =
    LazyLock::new(|| HostPolicy::new("github.com,*.example.org", "").unwrap());

fuzz_target!(|data: &[u8]| {
    let Some((&selector, json)) = data.split_first() else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    if let Ok(spec) = toolkit::spec_from_value(value.clone()) {
        let _ = spec.resolve(&HOSTS);
    }
    let Value::Object(arguments) = value else {
        return;
    };
    let tool = TOOLS[usize::from(selector) % TOOLS.len()];
    match decode(tool, Some(arguments)) {
        Ok(Call::Open(request)) => {
            let _ = toolkit::resolve_request(&request.toolkits, &HOSTS);
        }
        Ok(Call::Read { length, .. }) => assert!((1..=1 << 20).contains(&length)),
        Ok(_) => {}
        Err(e) => assert!(!e.message.is_empty()),
    }
});
