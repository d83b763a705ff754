// The presets are embedded from the repository's presets/ folder; rebuild when they change.
fn main() {
    println!("cargo:rerun-if-changed=../../presets/builtin");
}
