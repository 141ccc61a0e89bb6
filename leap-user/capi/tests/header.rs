//! `include/leap.h` is what cbindgen makes of the crate today: a change to
//! the API without the header (or the other way) fails here, naming the
//! command that refreshes it.

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not read the crate")
        .write(&mut generated);
    let path = dir.join("include/leap.h");
    if std::env::var_os("LEAP_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing include/leap.h");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "leap-user/capi/include/leap.h is stale (the C API changed): refresh it with \
         `LEAP_BLESS=1 cargo test -p leap-capi --test header` and commit it"
    );
}
