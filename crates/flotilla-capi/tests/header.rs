//! `include/flotilla.h` is what cbindgen generates from this crate today; run with
//! FLOTILLA_BLESS=1 to regenerate it after changing the API.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = crate_dir.join("include").join("flotilla.h");
    let committed = std::fs::read(&path).unwrap_or_default();
    if generated == committed {
        return;
    }
    if std::env::var_os("FLOTILLA_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/flotilla.h");
        return;
    }
    panic!(
        "{} is stale: regenerate it with `FLOTILLA_BLESS=1 cargo test -p flotilla-capi --test header`",
        path.display()
    );
}
