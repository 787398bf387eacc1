//! Bounds on what API clients can hold: connections per listener, requests
//! in flight, event-stream subscribers, request bodies and request time.
//! Past a bound a request is refused at once (503, or 413 for a body) rather
//! than queued: nothing an API client does grows without bound, and the
//! control loop never waits on it.
//!
//! The connection bound is written here because axum's `serve` has none and
//! tower's limits count requests, not connections: a listener that takes a
//! semaphore permit per accepted connection and gives it back when the
//! connection closes. More clients wait in the kernel's listen backlog. A
//! connection still for a minute is closed (axum's `serve` sets no hyper
//! timer, so hyper's own header timeout never runs): idle clients cannot
//! hold the places for ever, and a subscriber that stopped reading its event
//! stream loses its place even while the daemon has nothing to send.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use std::future::Future;
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

/// A connection that moves no byte either way for this long while waiting
/// to (an idle keep-alive connection, a client that stopped reading its
/// event stream or stalls sending a request) is closed. Event streams send a
/// keep-alive comment every 15 s, so a live one never gets near it.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

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
        (BoundedIo::new(io, permit, STALL_TIMEOUT), addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that gives its place back when dropped, and fails once it
/// has waited [`STALL_TIMEOUT`] without moving a byte.
pub struct BoundedIo<I> {
    io: I,
    _permit: OwnedSemaphorePermit,
    still_for: Duration,
    stall: Pin<Box<tokio::time::Sleep>>,
}

impl<I> BoundedIo<I> {
    fn new(io: I, permit: OwnedSemaphorePermit, still_for: Duration) -> Self {
        BoundedIo {
            io,
            _permit: permit,
            still_for,
            stall: Box::pin(tokio::time::sleep(still_for)),
        }
    }

    fn moved(&mut self) {
        let deadline = tokio::time::Instant::now() + self.still_for;
        self.stall.as_mut().reset(deadline);
    }

    /// A write's outcome, noting progress or a stall.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => self.pending(cx),
            other => other,
        }
    }

    /// What a pending read or write becomes: still pending, or an error
    /// once the connection has been still for too long.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        match self.stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection still for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for BoundedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => self.pending(cx),
            other => other,
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for BoundedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(cx, polled)
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
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Paused time: the clock moves only when every task waits, so the test
    // is about order, not about how fast this machine is.
    #[tokio::test(start_paused = true)]
    async fn a_still_connection_fails_and_gives_its_place_back() {
        let places = Arc::new(Semaphore::new(1));
        let (client, server) = tokio::io::duplex(64);
        let permit = places.clone().try_acquire_owned().unwrap();
        let mut io = BoundedIo::new(server, permit, Duration::from_millis(100));
        let mut client = client;
        // Bytes that move keep it alive past the timeout.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            client.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            io.read_exact(&mut one).await.unwrap();
        }
        // Then nothing: the read fails, and the place is free once it is dropped.
        let mut buf = [0u8; 1];
        let e = io.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(places.clone().try_acquire_owned().is_err());
        drop(io);
        assert!(places.try_acquire_owned().is_ok());
        // A writer whose reader stopped reading fails the same way.
        let (reader, writer) = tokio::io::duplex(8);
        let places = Arc::new(Semaphore::new(1));
        let mut io = BoundedIo::new(
            writer,
            places.try_acquire_owned().unwrap(),
            Duration::from_millis(100),
        );
        let e = io.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        drop(reader);
    }
}
