//! Where the XDP object comes from: embedded by `cargo xtask build`, or a
//! file from `cargo xtask build-ebpf` given with `--xdp-object PATH`.

use std::borrow::Cow;
use std::path::PathBuf;

use super::XdpError;

/// Environment variable naming an object file to use when none is embedded
/// and none is given explicitly (the privileged tests use it).
pub const OBJECT_ENV: &str = "LEAP_XDP_OBJECT";

/// The object embedded at build time, if any.
pub fn embedded() -> Option<&'static [u8]> {
    #[cfg(leap_xdp_embedded)]
    {
        Some(aya::include_bytes_aligned!(env!("LEAP_XDP_OBJECT_PATH")))
    }
    #[cfg(not(leap_xdp_embedded))]
    {
        None
    }
}

/// Which XDP object to load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ObjectSource {
    /// The embedded object, else the file named by `$LEAP_XDP_OBJECT`.
    #[default]
    Default,
    /// This file.
    File(PathBuf),
}

impl ObjectSource {
    /// `File(path)` when a path is given, else `Default`.
    pub fn from_option(path: Option<PathBuf>) -> Self {
        path.map_or(Self::Default, Self::File)
    }

    /// The object bytes.
    ///
    /// # Errors
    ///
    /// [`XdpError::NoObject`] when nothing is embedded and no file is named,
    /// [`XdpError::ReadObject`] when the file cannot be read.
    pub fn bytes(&self) -> Result<Cow<'static, [u8]>, XdpError> {
        let path = match self {
            Self::File(p) => p.clone(),
            Self::Default => {
                if let Some(b) = embedded() {
                    return Ok(Cow::Borrowed(b));
                }
                match std::env::var_os(OBJECT_ENV).filter(|p| !p.is_empty()) {
                    Some(p) => PathBuf::from(p),
                    None => return Err(XdpError::NoObject),
                }
            }
        };
        std::fs::read(&path).map(Cow::Owned).map_err(|source| XdpError::ReadObject { path, source })
    }
}
