fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Chunk payloads as `Bytes` so the node slices one buffer into chunks
    // without copying each.
    tonic_build::configure().bytes(["."]).compile_protos(&["proto/store.proto"], &["proto"])?;
    Ok(())
}
