// Keyway: upstream's build.rs calls `tonic_prost_build::compile_protos`,
// which runs `protoc`. This one parses the same protos with protox (a
// pure-Rust protobuf compiler, which bundles the well-known types) and hands
// the descriptors to the same generator, so the crate builds with only the
// Rust toolchain. The generated code is byte for byte the same; see
// KEYWAY-PATCH.md.

#[cfg(feature = "build-server")]
fn should_build_server() -> bool {
    true
}

#[cfg(not(feature = "build-server"))]
fn should_build_server() -> bool {
    false
}

fn main() {
    let proto_root = "proto";
    println!("cargo:rerun-if-changed={proto_root}");

    let fds = protox::compile(
        [
            "proto/etcd/api/authpb/auth.proto",
            "proto/etcd/api/etcdserverpb/rpc.proto",
            "proto/etcd/api/mvccpb/kv.proto",
            "proto/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
            "proto/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
        ],
        [proto_root],
    )
    .expect("Failed to parse proto files");

    tonic_prost_build::configure()
        .build_server(should_build_server())
        // `compile_protos` adds this attribute itself; `compile_fds` does not.
        .type_attribute(".", "#[allow(clippy::all)]")
        .compile_fds(fds)
        .expect("Failed to compile proto files");
}
