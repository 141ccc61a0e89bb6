//! Embeds the XDP object into `leap` when `cargo xtask build` names it in
//! `LEAP_XDP_OBJECT`. Without that variable leap builds without it, and the
//! XDP backend asks for `--xdp-object PATH` instead.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(leap_xdp_embedded)");
    println!("cargo::rerun-if-env-changed=LEAP_XDP_OBJECT");
    let Some(path) = std::env::var_os("LEAP_XDP_OBJECT").filter(|p| !p.is_empty()).map(PathBuf::from) else {
        return;
    };
    let path = match path.canonicalize() {
        Ok(p) if p.is_file() => p,
        _ => panic!("LEAP_XDP_OBJECT={} is not a file; run `cargo xtask build-ebpf` first", path.display()),
    };
    let Some(utf8) = path.to_str() else {
        panic!("LEAP_XDP_OBJECT={} is not valid UTF-8", path.display());
    };
    println!("cargo::rerun-if-changed={utf8}");
    println!("cargo::rustc-env=LEAP_XDP_OBJECT_PATH={utf8}");
    println!("cargo::rustc-cfg=leap_xdp_embedded");
}
