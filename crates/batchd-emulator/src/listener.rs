//! A TCP listener whose connections a request handler can reset, for the `reset` fault.
//!
//! Each accepted stream carries a shared switch; the handler receives the same switch as connect info.
//! Once the switch is on, every read or write fails and the socket is closed with `SO_LINGER` 0,
//! so the client sees a connection reset instead of any HTTP response.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    extract::connect_info::Connected,
    serve::{IncomingStream, Listener},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
};

/// Wraps a [`TcpListener`] so that every connection can be reset from a handler.
#[derive(Debug)]
pub(crate) struct ResettableListener {
    /// The bound socket.
    inner: TcpListener,
}

impl ResettableListener {
    pub fn new(inner: TcpListener) -> Self {
        Self { inner }
    }
}

impl Listener for ResettableListener {
    type Io = ResettableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, remote)) => {
                    let stream = ResettableStream { inner: stream, reset: Arc::new(AtomicBool::new(false)) };
                    return (stream, remote);
                }
                Err(error) => {
                    // Usually too many open files; back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A TCP stream that fails every operation once its reset switch is on.
#[derive(Debug)]
pub(crate) struct ResettableStream {
    /// The accepted socket.
    inner: TcpStream,
    /// Shared with the [`Connection`] that handlers see.
    reset: Arc<AtomicBool>,
}

impl ResettableStream {
    /// If the switch is on: make closing send RST, and return the error every operation then fails with.
    fn check_reset(&self) -> io::Result<()> {
        if !self.reset.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Err(error) = self.inner.set_zero_linger() {
            tracing::debug!(%error, "set SO_LINGER 0");
        }
        Err(io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by an injected fault"))
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_reset()?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_reset()?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_reset()?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_reset()?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// Connect info handed to handlers: who is calling, and the switch that resets their connection.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    /// The peer's address.
    pub remote: SocketAddr,
    /// The address the connection arrived on (which listener, when there are several).
    pub local: SocketAddr,
    /// The switch of the connection's [`ResettableStream`].
    reset: Arc<AtomicBool>,
}

impl Connection {
    /// Resets the connection: no response written after this reaches the client.
    pub fn reset(&self) {
        self.reset.store(true, Ordering::Release);
    }
}

impl Connected<IncomingStream<'_, ResettableListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, ResettableListener>) -> Self {
        let io = stream.io();
        Self {
            remote: *stream.remote_addr(),
            local: io.inner.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0))),
            reset: Arc::clone(&io.reset),
        }
    }
}
