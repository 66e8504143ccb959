//! Compiles `proto/meta.proto` without `protoc`: protox (a pure-Rust protobuf
//! compiler) parses it into a `FileDescriptorSet`, and tonic-prost-build
//! generates the messages, the client and the server from that set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/meta.proto");
    let fds = protox::compile(["meta.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
