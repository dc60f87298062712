//! A TCP proxy between Redis clients and a server that breaks the network on command.
//!
//! [`RedisServer`](crate::RedisServer) breaks the server (kill, pause, restart); this proxy breaks
//! the link instead: it can swallow every byte (a hung network), refuse and reset connections, add
//! latency, or lose a reply while the server still runs the command. It runs on its own
//! thread with its own runtime, so a fault applies whatever the test's runtime does.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// Bound on connecting to the target for each accepted connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on waiting, in [`FaultProxy::reset_connections`], for the resets to be done.
const RESET_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest chunk read (and forwarded) at once.
const CHUNK_SIZE: usize = 16 * 1024;
/// Chunks queued per direction (delayed by [`Fault::Latency`]) before reading pauses.
const QUEUE_CHUNKS: usize = 64;
/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(10);

/// What a [`FaultProxy`] does to the traffic; see [`FaultProxy::set_fault`].
///
/// Faults are checked for every chunk read, in either direction, so changing the fault affects
/// open connections as well as new ones. A chunk is what one `read` of a socket returns (at most
/// 16 KiB): a command or a reply may span several chunks, and several may share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Forwards both ways, at once.
    #[default]
    None,
    /// A hung network: connections are still accepted, but every byte is swallowed in both
    /// directions and nothing is answered or closed. Even an end closing its side is not passed
    /// on until the fault changes. Clients hit their timeouts; commands swallowed never run.
    ///
    /// When the fault changes from `BlackHole` to another, every connection that had bytes
    /// swallowed is reset (before [`FaultProxy::set_fault`] returns): its stream has a hole, and
    /// going on would put the client out of step (see [`Fault::DropNextReply`]). Connections
    /// that sent nothing meanwhile go on.
    BlackHole,
    /// Setting it resets every open connection (before [`FaultProxy::set_fault`] returns); while
    /// it lasts, each new connection is accepted and reset at once. Clients see a connection
    /// reset (or an early end of stream), not `ECONNREFUSED`.
    Refuse,
    /// Delays each chunk, in either direction, by this much after it was read: a request and its
    /// reply are each delayed, so a round trip takes at least twice as long. Chunks stay in order.
    Latency(Duration),
    /// Loses the reply to the next command, once, while the server still runs the command (e.g.
    /// "the acquire script ran but the reply was lost"), then breaks that connection.
    ///
    /// The next chunk any client sends, on any connection, is forwarded and disarms the fault:
    /// from then on [`FaultProxy::fault`] reads [`Fault::None`]. That connection is then lost:
    /// everything the server sends on it is dropped (the reply and anything after), and the next
    /// chunk the client sends on it is not forwarded but resets the connection (both sides). So
    /// the client's command times out although the server ran it, the connection's next command
    /// fails with a reset, and other and new connections are unaffected.
    ///
    /// A TCP stream cannot lose one reply and go on, and clients count on that: after a timeout,
    /// redis-rs skips the late reply it still expects, so forwarding later replies would shift
    /// every answer by one. Hence the reset.
    ///
    /// Arm it on an idle proxy, after connecting (connecting sends commands too, `CLIENT
    /// SETINFO`, which would take the fault). The command should fit in one chunk (one write of
    /// at most 16 KiB, as redis-rs sends a command): if it spans several, the second resets the
    /// connection and the server never gets the whole command. If the chunk held several commands
    /// (a pipeline), all their replies are lost. On a multiplexed connection, another command
    /// sent before the client times out resets the connection, so the lost command fails with a
    /// reset rather than a timeout.
    DropNextReply,
}

/// A TCP proxy on a free port of 127.0.0.1 that forwards to a target (a Redis server) and
/// injects [`Fault`]s on command.
///
/// Point clients at [`url`](Self::url) instead of the server's, then call
/// [`set_fault`](Self::set_fault) or [`reset_connections`](Self::reset_connections). Each
/// accepted connection opens its own connection to the target (within 2 s; if that fails, the
/// client's connection is reset).
///
/// Dropping the proxy stops it: its port is closed and so are all its connections, both to the
/// clients and to the target.
///
/// ```
/// use std::time::Duration;
/// use wavegate_testkit::{Fault, FaultProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr())?;
/// let mut con = redis::Client::open(proxy.url())?.get_connection_with_timeout(Duration::from_secs(2))?;
/// con.set_read_timeout(Some(Duration::from_millis(300)))?;
/// redis::cmd("PING").exec(&mut con)?;
///
/// proxy.set_fault(Fault::BlackHole);
/// let err = redis::cmd("PING").exec(&mut con).unwrap_err();
/// assert!(err.is_timeout());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts proxying to `target`, with [`Fault::None`], on a free port of 127.0.0.1.
    ///
    /// # Errors
    ///
    /// Fails if the port cannot be bound or the proxy's thread or runtime cannot be started.
    /// The target is not contacted until a client connects.
    pub fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared { fault: watch::Sender::new(Fault::None), registry: Mutex::default() });
        let (shutdown, stopped) = oneshot::channel();
        let served = shared.clone();
        let thread = std::thread::Builder::new().name("fault-proxy".into()).spawn(move || {
            runtime.block_on(async move {
                tokio::select! {
                    () = accept_loop(listener, target, served) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection task, hence every socket.
        })?;
        Ok(Self { addr, target, shared, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The proxy's URL, `redis://127.0.0.1:{port}/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Switches to `fault`, for open connections (from their next chunk on) and new ones.
    ///
    /// [`Fault::Refuse`] also resets every open connection, like
    /// [`reset_connections`](Self::reset_connections), and leaving [`Fault::BlackHole`] resets
    /// those that lost bytes in it; either way the resets are done when this returns (it blocks
    /// the calling thread for that, at most 2 s).
    pub fn set_fault(&self, fault: Fault) {
        let killed = {
            // Under the registry lock, so that no connection is accepted past a `Refuse`.
            let mut registry = lock(&self.shared.registry);
            let before = self.shared.fault.send_replace(fault);
            if fault == Fault::Refuse {
                registry.drain(|_| true)
            } else if before == Fault::BlackHole && fault != Fault::BlackHole {
                registry.drain(|flags| flags.swallowed.load(Ordering::SeqCst))
            } else {
                Vec::new()
            }
        };
        reset(killed);
    }

    /// The current fault ([`Fault::None`] once a [`Fault::DropNextReply`] has fired).
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Resets every open connection now, on both sides (TCP RST, via `SO_LINGER` 0): clients see
    /// their next read or write fail. New connections are accepted as usual (unless the fault is
    /// [`Fault::Refuse`]).
    ///
    /// Returns once the sockets are closed (it blocks the calling thread for that, at most 2 s).
    pub fn reset_connections(&self) {
        let killed = lock(&self.shared.registry).drain(|_| true);
        reset(killed);
    }

    /// Client connections the proxy holds open now.
    ///
    /// A connection counts from its accept until the proxy closes it: after both ends closed, after
    /// an error on either end, or when it is reset. Under [`Fault::BlackHole`] a connection whose
    /// client has gone still counts, since the proxy passes the close on only when the fault ends.
    pub fn connections(&self) -> usize {
        lock(&self.shared.registry).live.len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// State shared by the handle and the proxy's tasks.
#[derive(Debug)]
struct Shared {
    /// The current fault; connections subscribe to wait for the end of a [`Fault::BlackHole`].
    fault: watch::Sender<Fault>,
    registry: Mutex<Registry>,
}

/// Sent to a connection to reset it; it drops the sender once its sockets are closed.
type Ack = std_mpsc::Sender<()>;

/// The open connections.
#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    live: HashMap<u64, Entry>,
}

/// An open connection: what it went through, and the means to reset it.
#[derive(Debug)]
struct Entry {
    flags: Arc<Flags>,
    kill: oneshot::Sender<Ack>,
}

/// What a connection went through.
#[derive(Debug, Default)]
struct Flags {
    /// It took a [`Fault::DropNextReply`]: its reply was lost.
    lost: AtomicBool,
    /// Bytes of it were swallowed by a [`Fault::BlackHole`] (set under the registry lock).
    swallowed: AtomicBool,
}

impl Registry {
    /// Forgets the open connections `which` selects and returns their reset triggers.
    fn drain(&mut self, mut which: impl FnMut(&Flags) -> bool) -> Vec<oneshot::Sender<Ack>> {
        self.live.extract_if(|_, entry| which(&entry.flags)).map(|(_, entry)| entry.kill).collect()
    }
}

/// Removes a connection from the registry when its task ends (or is dropped with the runtime).
#[derive(Debug)]
struct Registration {
    id: u64,
    shared: Arc<Shared>,
    flags: Arc<Flags>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.shared.registry).live.remove(&self.id);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Resets the given connections and waits (bounded) until all have closed their sockets.
fn reset(killed: Vec<oneshot::Sender<Ack>>) {
    if killed.is_empty() {
        return;
    }
    let (ack, acked) = std_mpsc::channel();
    for kill in killed {
        // A connection that already ended has dropped its receiver: nothing to wait for.
        let _ = kill.send(ack.clone());
    }
    drop(ack);
    // Disconnected once every connection dropped its clone of `ack`.
    let _ = acked.recv_timeout(RESET_TIMEOUT);
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                continue;
            }
        };
        let admitted = {
            let mut registry = lock(&shared.registry);
            if *shared.fault.borrow() == Fault::Refuse {
                None
            } else {
                let id = registry.next_id;
                registry.next_id += 1;
                let (kill, killed) = oneshot::channel();
                let flags = Arc::new(Flags::default());
                registry.live.insert(id, Entry { flags: flags.clone(), kill });
                Some((Registration { id, shared: shared.clone(), flags }, killed))
            }
        };
        match admitted {
            None => {
                let _ = client.set_zero_linger();
            }
            Some((registration, killed)) => {
                tokio::spawn(connection(client, target, registration, killed));
            }
        }
    }
}

/// Serves one client connection until it ends or is reset.
async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    registration: Registration,
    killed: oneshot::Receiver<Ack>,
) {
    let shared = registration.shared.clone();
    let mut server = None;
    let mut ack = None;
    let reset = tokio::select! {
        relayed = relay(&mut client, &mut server, target, &shared, &registration.flags) => relayed.is_err(),
        kill = killed => {
            ack = kill.ok();
            true
        }
    };
    if reset {
        let _ = client.set_zero_linger();
        if let Some(server) = &server {
            let _ = server.set_zero_linger();
        }
    }
    drop(client);
    drop(server);
    drop(registration);
    drop(ack);
}

/// Connects to the target and relays both ways until both directions have ended.
///
/// An error (connecting, reading or writing) ends the relay at once; the caller then resets both
/// sockets.
async fn relay(
    client: &mut TcpStream,
    server: &mut Option<TcpStream>,
    target: SocketAddr,
    shared: &Shared,
    flags: &Flags,
) -> io::Result<()> {
    let connected = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(connected) => connected,
        Err(_) => Err(io::Error::from(io::ErrorKind::TimedOut)),
    };
    let server = match connected {
        Ok(stream) => server.insert(stream),
        Err(err) => {
            // A hung network would not tell the client either.
            hold_while_black_hole(shared).await;
            return Err(err);
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.split();
    let (server_read, server_write) = server.split();
    tokio::try_join!(
        direction(Direction::ToServer, client_read, server_write, shared, flags),
        direction(Direction::ToClient, server_read, client_write, shared, flags),
    )?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// What becomes of a chunk just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Write it at this time.
    Forward(Instant),
    /// Drop it.
    Discard,
    /// Drop it and reset the connection.
    Reset,
}

/// Relays one direction: reads chunks, applies the fault to each, and writes the survivors when
/// due. At the end of the stream, shuts the other side's writing half down.
async fn direction(
    dir: Direction,
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    shared: &Shared,
    flags: &Flags,
) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let read = async move {
        let mut buf = vec![0; CHUNK_SIZE];
        let ended = loop {
            match from.read(&mut buf).await {
                Ok(0) => break Ok(()),
                Ok(n) => match route(dir, shared, flags) {
                    Verdict::Forward(due) => {
                        if queue.send((due, buf[..n].to_vec())).await.is_err() {
                            break Ok(()); // The writer failed; its error ends the connection.
                        }
                    }
                    Verdict::Discard => {}
                    Verdict::Reset => {
                        return Err(io::Error::new(io::ErrorKind::ConnectionReset, "reply lost by DropNextReply"));
                    }
                },
                Err(err) => break Err(err),
            }
        };
        // Neither an end of stream nor an error gets through a black hole.
        hold_while_black_hole(shared).await;
        ended
        // Dropping `queue` lets the writer finish what is queued, then shut down.
    };
    let write = async move {
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write)?;
    Ok(())
}

/// Decides the fate of a chunk just read in direction `dir` on the connection with `flags`.
fn route(dir: Direction, shared: &Shared, flags: &Flags) -> Verdict {
    let now = Instant::now();
    let lost = flags.lost.load(Ordering::SeqCst);
    match dir {
        Direction::ToServer if lost => return Verdict::Reset,
        Direction::ToClient if lost => return Verdict::Discard,
        Direction::ToServer => {
            let took = shared.fault.send_if_modified(|fault| {
                let armed = *fault == Fault::DropNextReply;
                if armed {
                    *fault = Fault::None;
                }
                armed
            });
            if took {
                // Before forwarding, so that no byte of the reply can get through.
                flags.lost.store(true, Ordering::SeqCst);
                return Verdict::Forward(now);
            }
        }
        Direction::ToClient => {}
    }
    let mut fault = *shared.fault.borrow();
    if fault == Fault::BlackHole {
        // Under the lock, so that `set_fault` leaving the black hole sees the flag.
        let _registry = lock(&shared.registry);
        fault = *shared.fault.borrow();
        if fault == Fault::BlackHole {
            flags.swallowed.store(true, Ordering::SeqCst);
            return Verdict::Discard;
        }
        // The black hole has just ended: this chunk is not swallowed.
    }
    match fault {
        // An armed `DropNextReply` is for the client's next chunk; replies in flight pass.
        Fault::None | Fault::DropNextReply => Verdict::Forward(now),
        Fault::Latency(delay) => Verdict::Forward(now + delay),
        // Refuse: the connection is being reset; nothing more gets through.
        Fault::BlackHole | Fault::Refuse => Verdict::Discard,
    }
}

/// Returns once the fault is not [`Fault::BlackHole`].
async fn hold_while_black_hole(shared: &Shared) {
    let mut fault = shared.fault.subscribe();
    // Fails only if the sender is gone, which cannot happen while `shared` is borrowed.
    let _ = fault.wait_for(|fault| *fault != Fault::BlackHole).await;
}
