//! Bounds on what API clients can hold: connections per listener, requests
//! in flight, event-stream subscribers, request bodies and request time.
//! Past a bound a request is refused at once (503, or 413 for a body) rather
//! than queued: nothing an API client does grows without bound, and the
//! control loop never waits on it.
//!
//! The connection bound is written here because axum's `serve` has none and
//! tower's limits count requests, not connections: a listener that takes a
//! semaphore permit per accepted connection and gives it back when the
//! connection closes. More clients wait in the kernel's listen backlog.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Open connections per listener.
pub const MAX_CONNECTIONS: usize = 256;
/// Requests being answered at once per listener (event streams aside).
pub const MAX_IN_FLIGHT: usize = 64;
/// Event-stream (`/api/v1/samples`) subscribers per listener.
pub const MAX_STREAMS: usize = 32;
/// Largest request body: a PATCH is a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest a request may take (a change waits at most 10 s for the control
/// thread; this bounds everything else).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The path of the event stream, which is long-lived by design.
pub const STREAM_PATH: &str = "/api/v1/samples";

/// The bounds of one listener's API.
#[derive(Clone, Debug)]
pub struct Limits {
    in_flight: Arc<Semaphore>,
    streams: Arc<Semaphore>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
        }
    }
}

/// A request refused for a bound: 503 with `Retry-After`, and what was full.
#[derive(Debug)]
pub struct Busy(String);

impl IntoResponse for Busy {
    fn into_response(self) -> Response {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            axum::Json(serde_json::json!({ "error": self.0 })),
        )
            .into_response()
    }
}

fn busy(what: String) -> Response {
    Busy(what).into_response()
}

impl Limits {
    /// A place for one more event-stream subscriber, or the 503 that
    /// refuses it; the place is held as long as the stream is.
    pub fn stream_permit(&self) -> Result<OwnedSemaphorePermit, Busy> {
        self.streams.clone().try_acquire_owned().map_err(|_| {
            Busy(format!(
                "busy: {MAX_STREAMS} event streams are open; retry later"
            ))
        })
    }
}

/// Middleware: refuses a request beyond [`MAX_IN_FLIGHT`] and ends one that
/// runs past [`REQUEST_TIMEOUT`], both with a 503 that says which.
pub async fn bound_requests(
    State(limits): State<Limits>,
    request: Request,
    next: Next,
) -> Response {
    if request.uri().path() == STREAM_PATH {
        return next.run(request).await;
    }
    let Ok(_permit) = limits.in_flight.clone().try_acquire_owned() else {
        return busy(format!(
            "busy: {MAX_IN_FLIGHT} requests in flight; retry later"
        ));
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => busy(format!(
            "the request took longer than {REQUEST_TIMEOUT:?} and was ended"
        )),
    }
}

/// A listener that holds at most `max` connections open at once.
pub struct BoundedListener<L> {
    inner: L,
    permits: Arc<Semaphore>,
}

impl<L> BoundedListener<L> {
    pub fn new(inner: L, max: usize) -> Self {
        BoundedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
        }
    }
}

impl<L: Listener> Listener for BoundedListener<L> {
    type Io = BoundedIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (io, addr) = self.inner.accept().await;
        (
            BoundedIo {
                io,
                _permit: permit,
            },
            addr,
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that gives its place back when dropped.
pub struct BoundedIo<I> {
    io: I,
    _permit: OwnedSemaphorePermit,
}

impl<I: AsyncRead + Unpin> AsyncRead for BoundedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for BoundedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
