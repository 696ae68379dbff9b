//! Compiles `stoker/v1/*.proto` with the vendored protoc, so no system protoc is needed.

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
    ];
    for file in files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".stoker.v1")
        .compile_protos(&files, &["."])?;
    Ok(())
}
