//! Compiles the wire contract with protox (pure Rust, no system `protoc`) and
//! generates prost messages plus tonic client and server code from it.

use prost::Message;
use std::path::PathBuf;

const PROTO_ROOT: &str = "../../proto";
const PROTO_FILE: &str = "../../proto/inferencecache/v1alpha1/inferencecache.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_FILE}");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let fds = protox::compile([PROTO_FILE], [PROTO_ROOT])?;
    // The encoded set is served by gRPC reflection, so grpcurl needs no .proto file.
    std::fs::write(
        out_dir.join("inferencecache_descriptor.bin"),
        fds.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // INVALID_ARGUMENT for undecodable messages (src/codec.rs).
        .codec_path("crate::codec::ContractCodec")
        // A lookup's block hashes are slices of the request buffer, not one
        // allocation each (32+ per lookup on the hot path).
        .bytes(".inferencecache.v1alpha1.LookupRouteRequest.block_hashes")
        .compile_fds(fds)?;
    Ok(())
}
