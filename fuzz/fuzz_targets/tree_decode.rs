//! The canonical tree decoder: a tree it accepts encodes back to exactly the same bytes (so a
//! digest names one tree), and every name in it is one safe path segment.
#![no_main]

use cloud_harness_store::cas::Tree;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tree) = Tree::decode(data) {
        assert_eq!(tree.encode(), data, "decode is not the inverse of encode");
        for e in tree.entries() {
            assert!(!e.name.is_empty() && !e.name.contains('/') && !e.name.contains('\0'));
            assert!(e.name != "." && e.name != "..");
        }
    }
});
