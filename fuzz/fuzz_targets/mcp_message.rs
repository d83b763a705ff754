//! The check every MCP message meets before the SDK sees it (HTTP bodies and stdio lines):
//! any bytes are taken or refused with a JSON-RPC error, never a panic; a message taken is a
//! JSON-RPC 2.0 object with a string method or a response, and a refusal is an error answer
//! with an HTTP status to send it with.
#![no_main]

use cloud_harness_mcp::malformed::check;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    match check(data) {
        None => {
            let message: Value = serde_json::from_slice(data).expect("a message taken is JSON");
            assert_eq!(message["jsonrpc"], "2.0", "{message}");
            assert!(
                message["method"].is_string()
                    || message.get("result").is_some()
                    || message.get("error").is_some(),
                "{message}"
            );
        }
        Some(refused) => {
            assert!(matches!(refused.status, 200 | 400 | 413), "{}", refused.status);
            assert_eq!(refused.answer["jsonrpc"], "2.0");
            assert!(refused.answer["error"]["code"].is_i64(), "{}", refused.answer);
            assert!(refused.answer["error"]["message"].is_string());
        }
    }
});
