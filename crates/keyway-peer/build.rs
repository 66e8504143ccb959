//! Compiles `proto/peer.proto` without `protoc`: protox (a pure-Rust protobuf
//! compiler) parses it into a `FileDescriptorSet`, and tonic-prost-build
//! generates the messages, the client and the server from that set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/peer.proto");
    let fds = protox::compile(["peer.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // `bytes::Bytes` for every `bytes` field: records decode without copies.
        .bytes(".")
        .compile_fds(fds)?;
    Ok(())
}
