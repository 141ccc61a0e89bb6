//! Files that hold a secret (the agents' token, a ring key): opened once
//! without following a symbolic link, and taken only when they are a
//! regular file, owned by root or by this process's effective user, of mode
//! 0600 or stricter. The checks are made on the open descriptor, so the file
//! cannot be swapped between check and read.

use std::io::{self, Read};
use std::path::Path;

/// Why a secret file cannot be used; each names the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretFileError {
    /// Opening or reading it failed.
    #[error("reading the {what} file {path}: {source}")]
    Read {
        /// "token" or "key".
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// The last component is a symbolic link (never followed: whoever can
    /// write the directory could aim it elsewhere).
    #[error("the {what} file {path} is a symbolic link; give the path of the file itself (install -m 600 FILE {path})")]
    Symlink {
        /// "token" or "key".
        what: &'static str,
        /// The file.
        path: String,
    },
    /// A directory, device, FIFO or socket.
    #[error("the {what} file {path} is not a regular file; put the {what} in a plain file of mode 0600")]
    NotRegular {
        /// "token" or "key".
        what: &'static str,
        /// The file.
        path: String,
    },
    /// Owned by someone who is neither root nor this process's user.
    #[error(
        "the {what} file {path} is owned by uid {owner}, neither root nor this service's user (uid {euid}); chown root {path} (or to the service user)"
    )]
    Owner {
        /// "token" or "key".
        what: &'static str,
        /// The file.
        path: String,
        /// Its owner.
        owner: u32,
        /// Ours.
        euid: u32,
    },
    /// Others may read or write it.
    #[error("the {what} file {path} is readable or writable by group or others (mode {mode:o}); chmod 600 {path}")]
    Exposed {
        /// "token" or "key".
        what: &'static str,
        /// The file.
        path: String,
        /// Its mode.
        mode: u32,
    },
}

/// Reads at most `max` bytes of the secret file at `path` (the `what` file,
/// for the errors), after the checks above.
///
/// # Errors
///
/// [`SecretFileError`].
pub fn read(path: &Path, what: &'static str, max: usize) -> Result<String, SecretFileError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let p = || path.display().to_string();
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(SecretFileError::Symlink { what, path: p() }),
        Err(source) => return Err(SecretFileError::Read { what, path: p(), source }),
    };
    let meta = f.metadata().map_err(|source| SecretFileError::Read { what, path: p(), source })?;
    let ft = meta.file_type();
    if !ft.is_file() || ft.is_fifo() || ft.is_socket() {
        return Err(SecretFileError::NotRegular { what, path: p() });
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(SecretFileError::Owner { what, path: p(), owner: meta.uid(), euid });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(SecretFileError::Exposed { what, path: p(), mode: meta.mode() & 0o7777 });
    }
    let mut buf = Vec::new();
    (&mut f).take(max as u64).read_to_end(&mut buf).map_err(|source| SecretFileError::Read {
        what,
        path: p(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Writes `text` to a new file at `path` of mode 0600 (never over an
/// existing file).
///
/// # Errors
///
/// Creating or writing failed ([`io::ErrorKind::AlreadyExists`] when the
/// file exists).
pub fn create(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}
