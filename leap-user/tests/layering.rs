//! The library's modules form layers (see the crate docs): a module only
//! names modules below it, so no two import each other. Read from the
//! sources, comments left out.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            v.push(p);
        }
    }
    v
}

/// The code of `file` without comment lines.
fn code(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Files of `module` (a file or a folder under `src/`) that name one of `above`.
fn offenders(module: &str, above: &[&str]) -> Vec<String> {
    let path = src().join(module);
    let files = if path.is_dir() { sources(&path) } else { vec![path.with_extension("rs")] };
    let mut bad = Vec::new();
    for f in files {
        let code = code(&f);
        for a in above {
            if code.contains(a) {
                bad.push(format!("{} names {a}", f.strip_prefix(src()).unwrap().display()));
            }
        }
    }
    bad
}

#[test]
fn library_layers_only_name_layers_below() {
    // Bottom to top; each names only what comes before it.
    let layers = ["sys", "frame", "netns", "transport", "telemetry", "ring"];
    let mut bad = Vec::new();
    for (i, m) in layers.iter().enumerate() {
        let above: Vec<String> =
            layers[i + 1..].iter().chain(["bench", "serve", "cli"].iter()).map(|a| format!("crate::{a}")).collect();
        bad.extend(offenders(m, &above.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn transport_modules_only_name_modules_below() {
    // config and send sit below datagram, datagram below the backends, the
    // backends below open, which only dispatches.
    let cases: &[(&str, &[&str])] = &[
        (
            "transport/config",
            &["super::datagram", "super::send", "super::udp", "super::tcp", "super::kmod", "super::xdp", "super::open"],
        ),
        (
            "transport/send",
            &["super::datagram", "super::udp", "super::tcp", "super::kmod", "super::xdp", "super::open"],
        ),
        ("transport/datagram", &["super::udp", "super::tcp", "super::kmod", "super::xdp", "super::open"]),
        ("transport/udp", &["super::kmod", "super::xdp", "super::open"]),
        ("transport/tcp", &["super::datagram", "super::kmod", "super::xdp", "super::open"]),
        ("transport/kmod", &["super::xdp", "super::open"]),
        ("transport/xdp", &["super::kmod", "super::open", "transport::open"]),
    ];
    let mut bad = Vec::new();
    for (m, above) in cases {
        bad.extend(offenders(m, above));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
