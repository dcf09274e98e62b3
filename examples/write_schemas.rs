//! Regenerate the JSON Schemas in `docs/schema/` from blklab's document
//! types, after changing one: `cargo run --example write_schemas`, then
//! commit the files. `tests/schema.rs` only compares them with the types
//! and fails, naming this command, when they differ.

use std::path::Path;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema");
    let written = blklab::record::schema::write_all(&dir).context("writing the schemas")?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
