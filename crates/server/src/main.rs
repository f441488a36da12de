//! The `tern` binary (being built).
fn main() {
    println!("tern {}", env!("CARGO_PKG_VERSION"));
}
