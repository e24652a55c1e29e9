// Generates the Rust types of proto/xla/compile_options.proto (pure Rust, no protoc needed).
fn main() {
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    println!("cargo:rerun-if-changed={proto_root}/xla/compile_options.proto");
    let descriptors = protox::compile(["xla/compile_options.proto"], [proto_root])
        .unwrap_or_else(|e| panic!("proto/xla/compile_options.proto: {e}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating Rust for compile_options.proto: {e}"));
}
