//! Gives `libleap.so` the SONAME `libleap.so.0`: programs linked against it
//! ask for that name, so a compatible newer library can replace it.

fn main() {
    println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,libleap.so.0");
}
