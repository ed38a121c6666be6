//! Compiles every `.proto` under `proto/` with protox (pure Rust: no system `protoc`).

use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    let mut files = Vec::new();
    collect(root, &mut files)?;
    files.sort();
    println!("cargo:rerun-if-changed=proto");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let relative: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(root).map(Path::to_path_buf))
        .collect::<Result<_, _>>()?;
    let fds = protox::compile(&relative, [root])?;
    // etcd's JSON gateway (`/v3/...`): serde for etcd's own packages, with the proto field
    // names etcd's gateway prints (`create_revision`, `ID`, `dbSize`) and unknown fields
    // ignored, as it ignores them.
    let descriptors = prost::Message::encode_to_vec(&fds);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .out_dir(&out)
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
