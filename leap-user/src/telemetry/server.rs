//! The `/metrics` HTTP server and the stats socket, on one thread with its
//! own tokio runtime, every connection bounded by [`Limits`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fs::Permissions;
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::AbortHandle;

use super::{Server, Telemetry, prometheus};

/// Mode of the stats socket: the node's user only (see the README: the
/// service runs as a dynamic user, so a group bit would open it to nobody
/// useful; operators read it as root).
pub const STATS_SOCKET_MODE: u32 = 0o600;

/// How much each server lets one client take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Connections open at once, per server. One more closes the oldest
    /// that has not sent its request head yet, else itself is closed; both
    /// are counted (`leap_telemetry_refused_connections_total`).
    pub max_connections: usize,
    /// Bytes of an HTTP request line and headers (hyper's minimum, 8 KiB,
    /// is also the floor here); a longer head is answered 431 and closed.
    pub max_request_head: usize,
    /// Time to send the whole request head.
    pub request_timeout: Duration,
    /// Time a connection may stay open, whatever it does.
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_request_head: 8 * 1024,
            request_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(10),
        }
    }
}

/// Errors starting the telemetry servers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The metrics address cannot be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// Something other than a socket is where the stats socket should go.
    #[error(
        "{} exists and is not a socket; leaving it alone: remove it or choose another --stats-socket",
        path.display()
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A live process answers on the stats socket's path.
    #[error(
        "{} is in use by a running process (another leap node?): stop it or choose another --stats-socket",
        path.display()
    )]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// A system call on the stats socket failed.
    #[error("stats socket {}: {call}: {source}", path.display())]
    StatsSocket {
        /// The path.
        path: PathBuf,
        /// The failing call.
        call: &'static str,
        /// Why.
        source: io::Error,
    },
    /// The server thread or its runtime could not start.
    #[error("starting the telemetry thread: {0}")]
    Thread(io::Error),
}

/// The running servers; stopped (and the stats socket removed) by
/// [`Servers::stop`] or on drop.
#[derive(Debug)]
pub struct Servers {
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Servers {
    /// Stops both servers, closes every connection and removes the stats
    /// socket; returns once that is done (connections are not drained).
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            log::error!("the telemetry thread panicked");
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

/// Serves `tel` as Prometheus text at `http://METRICS/metrics` and as JSON on
/// the Unix socket `stats`, each when given, on a thread of their own.
///
/// The stats socket is created with mode 0600. Where its path already is a
/// socket no process answers on (a crashed run's), it is replaced; anything
/// else there is an error and is left untouched.
///
/// # Errors
///
/// [`TelemetryError`]: binding either, or starting the thread.
pub fn serve(
    tel: Arc<Telemetry>,
    metrics: Option<SocketAddr>,
    stats: Option<&Path>,
    limits: Limits,
) -> Result<Servers, TelemetryError> {
    let metrics = match metrics {
        Some(addr) => Some(bind_tcp(addr).map_err(|source| TelemetryError::Bind { addr, source })?),
        None => None,
    };
    let mut stats = stats.map(StatsSocket::bind).transpose()?;
    if metrics.is_none() && stats.is_none() {
        return Ok(Servers { shutdown: None, thread: None });
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(TelemetryError::Thread)?;
    let (tx, rx) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("leap-telemetry".into())
        .spawn(move || {
            runtime.block_on(async {
                if let Some(l) = metrics {
                    match TcpListener::from_std(l) {
                        Ok(l) => drop(tokio::spawn(metrics_loop(l, tel.clone(), limits))),
                        Err(e) => log::error!("metrics: {e}"),
                    }
                }
                if let Some(s) = &mut stats {
                    match s.take_listener() {
                        Ok(l) => drop(tokio::spawn(stats_loop(l, tel.clone(), limits))),
                        Err(e) => log::error!("stats socket {}: {e}", s.path.display()),
                    }
                }
                let _ = rx.await;
            });
            // Dropping the runtime cancels every connection at once.
            drop(runtime);
            drop(stats);
        })
        .map_err(TelemetryError::Thread)?;
    Ok(Servers { shutdown: Some(tx), thread: Some(thread) })
}

fn bind_tcp(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The open connections of one server: at most [`Limits::max_connections`]
/// (also the `leap serve` agent's connections).
#[derive(Debug)]
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    /// Connections still waiting for their request head, oldest first, with
    /// the flag their service clears when the head has arrived.
    waiting: VecDeque<(AbortHandle, Arc<AtomicBool>)>,
    max: usize,
}

impl Connections {
    pub(crate) fn new(max: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(max)), waiting: VecDeque::new(), max }
    }

    /// A permit for a connection just accepted. When all are taken, the
    /// oldest connection still waiting for its request head is closed to
    /// make room, so that idle clients cannot lock a scrape out; without
    /// one, `None`: the new connection is to be closed. Either is counted.
    pub(crate) async fn admit(&mut self, refused: &(dyn Fn() + Sync)) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Some(p);
        }
        refused();
        self.waiting.retain(|(task, waiting)| !task.is_finished() && waiting.load(Ordering::Relaxed));
        let (task, _) = self.waiting.pop_front()?;
        task.abort();
        // The runtime drops the aborted task, and with it its permit, on its
        // next turn.
        let freed = tokio::time::timeout(Duration::from_millis(100), self.permits.clone().acquire_owned());
        freed.await.ok()?.ok()
    }

    /// Remembers a connection that waits for its request head.
    pub(crate) fn waiting(&mut self, task: AbortHandle, waiting: Arc<AtomicBool>) {
        if self.waiting.len() >= 2 * self.max {
            self.waiting.retain(|(task, waiting)| !task.is_finished() && waiting.load(Ordering::Relaxed));
        }
        self.waiting.push_back((task, waiting));
    }
}

/// Waits for the next connection; on errors (out of descriptors, say) lets
/// the open ones finish first.
async fn next<S, A>(accept: impl Future<Output = io::Result<(S, A)>>, server: Server) -> Option<S> {
    match accept.await {
        Ok((s, _)) => Some(s),
        Err(e) => {
            log::debug!("{}: accept: {e}", server.name());
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

async fn metrics_loop(l: TcpListener, tel: Arc<Telemetry>, limits: Limits) {
    let mut conns = Connections::new(limits.max_connections);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .max_buf_size(limits.max_request_head.max(8 * 1024))
        .max_headers(64)
        .keep_alive(false);
    loop {
        let Some(stream) = next(l.accept(), Server::Metrics).await else { continue };
        let Some(permit) = conns.admit(&|| tel.refuse(Server::Metrics)).await else { continue };
        let waiting = Arc::new(AtomicBool::new(true));
        let (tel, flag) = (tel.clone(), waiting.clone());
        let conn = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |req| {
                flag.store(false, Ordering::Relaxed);
                let tel = tel.clone();
                async move { Ok::<_, Infallible>(answer(&req, &tel)) }
            }),
        );
        let task = tokio::spawn(async move {
            let _permit = permit;
            // Over time or not, the connection is dropped, hence closed.
            let _ = tokio::time::timeout(limits.connection_timeout, conn).await;
        });
        conns.waiting(task.abort_handle(), waiting);
    }
}

fn answer(req: &Request<Incoming>, tel: &Telemetry) -> Response<Full<Bytes>> {
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" if get => (StatusCode::OK, prometheus::CONTENT_TYPE, tel.to_prometheus()),
        "/" if get => (StatusCode::OK, "text/plain; charset=utf-8", "leap node: metrics at /metrics\n".into()),
        "/metrics" | "/" => {
            (StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "only GET and HEAD here\n".into())
        }
        _ => (StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "not found; metrics are at /metrics\n".into()),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    r
}

/// Longest request the stats socket reads.
const MAX_REQUEST: usize = 64;
/// How long the stats socket waits for a request before it answers with
/// the counters (a client that sends nothing and keeps its side open).
const REQUEST_WAIT: Duration = Duration::from_millis(100);

/// The stats socket: reads a request (none, `release-source` or
/// `reload-keys`) up to its
/// end, a newline, [`MAX_REQUEST`] bytes or [`REQUEST_WAIT`], writes the
/// JSON, closes. Only the node's user reaches it (mode 0600).
async fn stats_loop(l: UnixListener, tel: Arc<Telemetry>, limits: Limits) {
    let mut conns = Connections::new(limits.max_connections);
    loop {
        let Some(mut stream) = next(l.accept(), Server::Stats).await else { continue };
        let Some(permit) = conns.admit(&|| tel.refuse(Server::Stats)).await else { continue };
        let tel = tel.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut req = [0u8; MAX_REQUEST];
            let mut n = 0;
            let read = async {
                while n < req.len() && !req[..n].contains(&b'\n') {
                    match stream.read(&mut req[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                }
            };
            let _ = tokio::time::timeout(REQUEST_WAIT, read).await;
            let reply = match std::str::from_utf8(&req[..n]).map(str::trim) {
                Ok("") => tel.to_json().to_string(),
                Ok("release-source") => tel.release_source().to_string(),
                // Reading two small files: not worth a blocking thread.
                Ok("reload-keys") => tel.reload_keys().to_string(),
                _ => serde_json::json!({
                    "error": "unknown request; send nothing (counters), `release-source` or `reload-keys`"
                })
                .to_string(),
            };
            let write = async {
                stream.write_all(reply.as_bytes()).await?;
                stream.shutdown().await
            };
            let _ = tokio::time::timeout(limits.connection_timeout, write).await;
        });
    }
}

/// The bound stats socket; its file is removed on drop if it is still ours.
#[derive(Debug)]
struct StatsSocket {
    path: PathBuf,
    listener: Option<std::os::unix::net::UnixListener>,
    /// Device and inode of the file we created.
    id: (u64, u64),
}

impl StatsSocket {
    fn bind(path: &Path) -> Result<Self, TelemetryError> {
        let fail = |call, source| TelemetryError::StatsSocket { path: path.into(), call, source };
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_socket() => return Err(TelemetryError::NotASocket { path: path.into() }),
            Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(TelemetryError::InUse { path: path.into() }),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    log::info!("replacing the stale stats socket {}", path.display());
                    std::fs::remove_file(path).map_err(|e| fail("unlink", e))?;
                }
                Err(e) => return Err(fail("connect", e)),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail("stat", e)),
        }
        let sock = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(|e| fail("socket", e))?;
        // bind(2) gives the file the socket inode's mode (less the umask),
        // so the socket is never reachable by others, not even briefly.
        // std offers fchmod(2) through `File` only; the fd is a socket.
        let file = std::fs::File::from(OwnedFd::from(sock));
        file.set_permissions(Permissions::from_mode(STATS_SOCKET_MODE)).map_err(|e| fail("fchmod", e))?;
        let sock = Socket::from(OwnedFd::from(file));
        let addr = SockAddr::unix(path).map_err(|e| fail("socket address", e))?;
        sock.bind(&addr).map_err(|e| fail("bind", e))?;
        let m = std::fs::symlink_metadata(path).map_err(|e| fail("stat", e))?;
        let mut me = Self { path: path.into(), listener: None, id: (m.dev(), m.ino()) };
        sock.listen(128).map_err(|e| fail("listen", e))?;
        sock.set_nonblocking(true).map_err(|e| fail("fcntl", e))?;
        me.listener = Some(sock.into());
        Ok(me)
    }

    /// The listener, for the runtime (once).
    fn take_listener(&mut self) -> io::Result<UnixListener> {
        UnixListener::from_std(self.listener.take().ok_or_else(|| io::Error::other("listener taken"))?)
    }
}

impl Drop for StatsSocket {
    fn drop(&mut self) {
        // Only our own file: a later node may have replaced it meanwhile.
        if let Ok(m) = std::fs::symlink_metadata(&self.path)
            && (m.dev(), m.ino()) == self.id
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
