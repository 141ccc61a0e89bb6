//! The client side of the stats socket (`leap stats`): a bounded read of
//! one JSON reply.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use socket2::{Domain, SockAddr, Socket, Type};

/// The largest reply [`query_stats`] accepts.
pub const MAX_STATS_REPLY: usize = 1 << 20;

/// How long [`query_stats`] waits for the whole reply.
pub const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors reading a node's stats socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatsQueryError {
    /// Nothing answers on the path.
    #[error("no leap node answers on {} ({source}); is it running with that --stats-socket?", path.display())]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Reading the reply failed.
    #[error("reading the reply: {0}")]
    Read(io::Error),
    /// The reply did not end in time.
    #[error("no complete reply within {0:?}; is this a leap node's stats socket?")]
    TimedOut(Duration),
    /// The reply is larger than a node's ever is.
    #[error("reply larger than {0} bytes; is this a leap node's stats socket?")]
    TooLarge(usize),
    /// The node hung up without a word: it was busy with too many clients.
    #[error("the node closed the connection without a reply (too many clients at once?); try again")]
    Empty,
    /// The reply is not JSON.
    #[error("reply is not JSON ({0}); is this a leap node's stats socket?")]
    Json(serde_json::Error),
}

/// Reads a node's counters from its stats socket: at most
/// [`MAX_STATS_REPLY`] bytes within [`STATS_TIMEOUT`].
///
/// # Errors
///
/// [`StatsQueryError`].
pub fn query_stats(path: &Path) -> Result<Value, StatsQueryError> {
    query_stats_within(path, MAX_STATS_REPLY, STATS_TIMEOUT)
}

/// [`query_stats`] with other bounds: at most `max` bytes, all within
/// `timeout` (connecting included).
///
/// # Errors
///
/// [`StatsQueryError`].
pub fn query_stats_within(path: &Path, max: usize, timeout: Duration) -> Result<Value, StatsQueryError> {
    request(path, b"", max, timeout)
}

/// Asks the node to release its lock on the previous node's source (see
/// [`crate::Transport::source_control`]); its reply says whether it held one.
///
/// # Errors
///
/// [`StatsQueryError`].
pub fn release_source(path: &Path) -> Result<Value, StatsQueryError> {
    request(path, b"release-source\n", MAX_STATS_REPLY, STATS_TIMEOUT)
}

/// Asks the node to read its ring key files again (as `SIGHUP` does); its
/// reply says which keys it now uses, or why it kept the old ones.
///
/// # Errors
///
/// [`StatsQueryError`].
pub fn reload_keys(path: &Path) -> Result<Value, StatsQueryError> {
    request(path, b"reload-keys\n", MAX_STATS_REPLY, STATS_TIMEOUT)
}

/// Sends `req` (then ends its side), reads the JSON reply.
fn request(path: &Path, req: &[u8], max: usize, timeout: Duration) -> Result<Value, StatsQueryError> {
    let deadline = Instant::now() + timeout;
    let connect = |source| StatsQueryError::Connect { path: path.into(), source };
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(connect)?;
    // A node whose accept queue is full would otherwise block connect(2).
    sock.connect_timeout(&SockAddr::unix(path).map_err(connect)?, timeout).map_err(connect)?;
    let mut s = UnixStream::from(std::os::fd::OwnedFd::from(sock));
    s.set_nonblocking(false).map_err(StatsQueryError::Read)?;
    s.set_write_timeout(Some(timeout)).map_err(StatsQueryError::Read)?;
    s.write_all(req).map_err(StatsQueryError::Read)?;
    // The node answers at once when it sees the end of the request.
    s.shutdown(std::net::Shutdown::Write).map_err(StatsQueryError::Read)?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StatsQueryError::TimedOut(timeout));
        }
        s.set_read_timeout(Some(left)).map_err(StatsQueryError::Read)?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if reply.len() + n > max => return Err(StatsQueryError::TooLarge(max)),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(StatsQueryError::TimedOut(timeout));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StatsQueryError::Read(e)),
        }
    }
    if reply.is_empty() {
        return Err(StatsQueryError::Empty);
    }
    serde_json::from_slice(&reply).map_err(StatsQueryError::Json)
}
