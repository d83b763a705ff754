//! A bundle record, as another runner or a bucket hands it over: any bytes give a record or a
//! typed refusal, never a panic; a record taken writes back to one that reads the same.
#![no_main]

use cloud_harness_error::Code;
use cloud_harness_provision::index::{BundleRecord, MAX_RECORD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match BundleRecord::decode(data) {
        Ok(record) => {
            let again = serde_json::to_vec(&record).expect("a record serializes");
            assert_eq!(BundleRecord::decode(&again).expect("it reads back"), record);
            let _ = record.key.id();
        }
        Err(e) => {
            assert!(matches!(e.code, Code::TooLarge | Code::InvalidArgument), "{e}");
            assert_eq!(e.code == Code::TooLarge, data.len() as u64 > MAX_RECORD, "{e}");
        }
    }
});
