// Generates the Rust types of proto/tpuc/fx.proto (pure Rust, no protoc needed).
fn main() {
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    println!("cargo:rerun-if-changed={proto_root}/tpuc/fx.proto");
    let descriptors = protox::compile(["tpuc/fx.proto"], [proto_root])
        .unwrap_or_else(|e| panic!("proto/tpuc/fx.proto: {e}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating Rust for fx.proto: {e}"));
}
