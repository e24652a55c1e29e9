// Generates the Rust types of the XLA protos in proto/xla (pure Rust, no protoc needed).
const PROTOS: [&str; 3] = [
    "xla/compile_options.proto",
    "xla/op_sharding.proto",
    "xla/hlo.proto",
];

fn main() {
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto_root}/{proto}");
    }
    let descriptors =
        protox::compile(PROTOS, [proto_root]).unwrap_or_else(|e| panic!("proto/{PROTOS:?}: {e}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating Rust for {PROTOS:?}: {e}"));
}
