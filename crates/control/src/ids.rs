//! Identifiers the harness makes: a prefix and 64 random bits in hex (`ws_…`, `ovr_…`,
//! `pin_…`, a runner's name).

/// An id of `prefix` and 16 random hex digits.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the kernel's random numbers");
    format!("{prefix}_{}", hex_of(&bytes))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
