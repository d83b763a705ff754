//! A bundle's pack, as a bucket hands it over: any bytes give its objects, each the bytes its
//! name says, or a refusal, never a panic; and never more objects than the limits allow.
#![no_main]

use cloud_harness_provision::remote::pack;
use cloud_harness_provision::staging::Limits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_files: 64,
        max_file_bytes: 4096,
        ..Limits::default()
    };
    if let Ok(objects) = pack::read_all(data, limits) {
        assert!(objects as u64 <= 2 * limits.max_files + 2);
    }
});
