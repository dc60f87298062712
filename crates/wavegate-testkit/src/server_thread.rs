//! A mock server's home: a loopback listener on a free port, served on a thread of its own with
//! its own single-threaded runtime (so it keeps serving whatever the test's runtime does), and
//! stopped — its serving future dropped, its thread joined — when dropped. Every mock of the
//! test kit runs on one ([`MockUpstream`](crate::MockUpstream), [`MockProvider`](crate::MockProvider),
//! [`MockSse`](crate::MockSse)).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A running server thread; stops on drop.
#[derive(Debug)]
pub(crate) struct ServerThread {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// Binds a free port of 127.0.0.1 and runs `serve(listener)` on a thread called `name`
    /// until the handle is dropped.
    pub(crate) fn start<F, Fut>(name: &str, serve: F) -> io::Result<Self>
    where
        F: FnOnce(TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (shutdown, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else { return };
                tokio::select! {
                    () = serve(listener) => {}
                    _ = stopped => {}
                }
            });
        })?;
        Ok(Self { addr, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
