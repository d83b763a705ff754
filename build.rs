// The built-in tier is embedded from presets/; rebuild when it changes.
fn main() {
    println!("cargo:rerun-if-changed=presets");
}
