//! Compiles `stoker/v1/*.proto` with the vendored protoc, so no system protoc is needed, and
//! keeps protoc's descriptor set of them (`stoker.v1.bin`, comments included): the crate embeds
//! it so the op language can be listed from the proto itself (`stoker_proto::op_schema`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };

    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let files = [
        "stoker/v1/job.proto",
        "stoker/v1/batch.proto",
        "stoker/v1/service.proto",
        "stoker/v1/lane_helper.proto",
    ];
    println!("cargo:rerun-if-changed=build.rs");
    for file in files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // The messages alone (what the batch pipeline and the datasets build on), and the messages
    // with the gRPC clients and servers (the `grpc` feature): a crate that plans and decodes
    // builds without tonic.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    let generated = out_dir.join(if grpc { "grpc" } else { "messages" });
    std::fs::create_dir_all(&generated)?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("stoker.v1.bin"))
        .out_dir(&generated)
        .build_server(grpc)
        .build_client(grpc)
        .bytes(".stoker.v1")
        .compile_protos(&files, &["."])?;
    Ok(())
}
