//! A signature's text and a repository URL, as a publisher, a bucket or a client hands them
//! over: any bytes give a signature or a typed refusal, never a panic; a parsed one names its
//! key and verifies nothing it was not made for; a URL's canonical spelling has no control
//! character and is its own canonical spelling.
#![no_main]

use cloud_harness_control::signatures::{canonical, Signed};
use cloud_harness_error::Code;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Signed::parse(&text) {
        Ok(signed) => {
            assert!(signed.fingerprint().starts_with("SHA256:"));
            assert!(!signed.verifies("cloud-harness fuzz: a message no one signed\n"));
        }
        Err(e) => assert_eq!(e.code, Code::InvalidArgument, "{e}"),
    }
    let once = canonical(&text);
    assert!(!once.chars().any(char::is_control), "{once:?}");
    assert_eq!(canonical(&once), once, "{text:?}");
});
