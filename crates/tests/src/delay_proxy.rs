//! A TCP delay proxy for remote-tree tests and benchmarks: there is no netem here, so ssh
//! reaches sshd through this relay, which adds a fixed one-way delay each way.
//!
//! Properties (each tested in `tests/delay_proxy.rs`):
//! - **Delay, not serialization.** Every chunk read from one side is stamped with
//!   `arrival + delay` and written to the other side at that time by a separate writer thread,
//!   while the reader keeps reading: a round trip costs `2 × delay` plus the real work, and a
//!   bulk transfer keeps (nearly) its throughput (pipelined, like a long fat pipe).
//! - **No reordering**: one FIFO queue per direction.
//! - **Bounded buffers**: at most `buffer` bytes queued per direction (the reader waits when the
//!   queue is full), so memory is bounded and throughput is at most `buffer / delay`.
//! - **Clean shutdown**: an end of stream is delayed like data and then forwarded as a
//!   half-close (`shutdown(Write)`); a write error closes the source; dropping a
//!   [`DelayProxy`] shuts every connection down and joins every thread.
//! - **Traffic counts** ([`Traffic`]): bytes, reads ("chunks") and *bursts* each way. A burst is
//!   a run of reads in one direction with no read in the other direction in between (per
//!   connection): for a request/response protocol the number of client-to-server bursts
//!   approximates the number of sequential round trips (requests sent together while waiting
//!   count once, as they cost one round trip of latency).
//!
//! Two ways to run it: [`DelayProxy::start`] listens on a local port and relays every
//! connection to a target (point ssh's `-p` at it), and [`relay_stdio`] relays stdin/stdout to
//! a target (for ssh's `ProxyCommand`; `dircache delay-proxy` is a front end to both).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default bound of the bytes queued per direction and connection (16 MiB: 16 GB/s at 1 ms).
pub const DEFAULT_BUFFER: usize = 16 << 20;
/// Largest single read.
const CHUNK: usize = 64 << 10;

/// Which way data flows: `Up` from the client (the side that connected to the proxy, or stdin)
/// to the server, `Down` back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dir {
    Up = 1,
    Down = 2,
}

/// A snapshot of the traffic counted by a proxy (all connections together).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Traffic {
    pub up_bytes: u64,
    pub down_bytes: u64,
    pub up_reads: u64,
    pub down_reads: u64,
    pub up_bursts: u64,
    pub down_bursts: u64,
    pub connections: u64,
}

impl Traffic {
    /// Approximate sequential round trips: the client-to-server bursts.
    pub fn round_trips(&self) -> u64 {
        self.up_bursts
    }

    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.up_bytes + self.down_bytes
    }

    /// The traffic since `earlier` (a snapshot of the same proxy).
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            up_bytes: self.up_bytes - earlier.up_bytes,
            down_bytes: self.down_bytes - earlier.down_bytes,
            up_reads: self.up_reads - earlier.up_reads,
            down_reads: self.down_reads - earlier.down_reads,
            up_bursts: self.up_bursts - earlier.up_bursts,
            down_bursts: self.down_bursts - earlier.down_bursts,
            connections: self.connections - earlier.connections,
        }
    }
}

/// Shared counters (monotonic; take [`Traffic`] snapshots and subtract).
#[derive(Default, Debug)]
pub struct Counters {
    up_bytes: AtomicU64,
    down_bytes: AtomicU64,
    up_reads: AtomicU64,
    down_reads: AtomicU64,
    up_bursts: AtomicU64,
    down_bursts: AtomicU64,
    connections: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> Traffic {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Traffic {
            up_bytes: l(&self.up_bytes),
            down_bytes: l(&self.down_bytes),
            up_reads: l(&self.up_reads),
            down_reads: l(&self.down_reads),
            up_bursts: l(&self.up_bursts),
            down_bursts: l(&self.down_bursts),
            connections: l(&self.connections),
        }
    }

    /// Count a read of `n` bytes in `dir` on a connection whose last read direction is `last`.
    fn record(&self, dir: Dir, n: usize, last: &AtomicU8) {
        let (bytes, reads, bursts) = match dir {
            Dir::Up => (&self.up_bytes, &self.up_reads, &self.up_bursts),
            Dir::Down => (&self.down_bytes, &self.down_reads, &self.down_bursts),
        };
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        reads.fetch_add(1, Ordering::Relaxed);
        if last.swap(dir as u8, Ordering::Relaxed) != dir as u8 {
            bursts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The settings shared by every connection of a proxy; the delay may change while running
/// (it applies to data read after the change).
#[derive(Debug)]
pub struct Shaping {
    delay_ns: AtomicU64,
    buffer: usize,
    pub counters: Counters,
}

impl Shaping {
    pub fn new(delay: Duration, buffer: usize) -> Arc<Shaping> {
        Arc::new(Shaping {
            delay_ns: AtomicU64::new(delay.as_nanos().min(u64::MAX as u128) as u64),
            buffer: buffer.max(CHUNK),
            counters: Counters::default(),
        })
    }

    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(Ordering::Relaxed))
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ns
            .store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }
}

/// A chunk due at `due`; empty data marks the end of the stream.
struct Chunk {
    due: Instant,
    data: Vec<u8>,
}

#[derive(Default)]
struct QState {
    q: VecDeque<Chunk>,
    bytes: usize,
    /// The writer is gone: the reader stops.
    closed: bool,
}

/// A bounded FIFO of delayed chunks between one reader and one writer thread.
#[derive(Default)]
struct Queue {
    st: Mutex<QState>,
    cv: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QState> {
        // A panicking peer cannot leave the queue inconsistent (plain pushes and pops).
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Push (waiting while more than `cap` bytes are queued); false once the writer is gone.
    fn push(&self, c: Chunk, cap: usize) -> bool {
        let mut g = self.lock();
        while !g.closed && g.bytes > 0 && g.bytes + c.data.len() > cap {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        if g.closed {
            return false;
        }
        g.bytes += c.data.len();
        g.q.push_back(c);
        self.cv.notify_all();
        true
    }

    fn pop(&self) -> Chunk {
        let mut g = self.lock();
        loop {
            if let Some(c) = g.q.pop_front() {
                g.bytes -= c.data.len();
                self.cv.notify_all();
                return c;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }
}

/// Relay `src` to `dst` in direction `dir` with the delay of `shaping`: a reader thread stamps
/// and queues what it reads, this thread writes each chunk when it is due. Returns when the
/// end of the stream was forwarded (`on_eof(dst)`, e.g. a half-close) or a write failed (then
/// `unblock_src()` is called so that the reader's blocked read returns). The reader thread is
/// joined unless `detach_reader` (for stdin, whose read cannot be interrupted).
#[allow(clippy::too_many_arguments)]
pub fn relay<R, W>(
    mut src: R,
    mut dst: W,
    dir: Dir,
    shaping: Arc<Shaping>,
    last: Arc<AtomicU8>,
    on_eof: impl FnOnce(&mut W),
    unblock_src: impl FnOnce(),
    detach_reader: bool,
) where
    R: Read + Send + 'static,
    W: Write,
{
    let q = Arc::new(Queue::default());
    let reader = {
        let q = q.clone();
        let sh = shaping.clone();
        std::thread::Builder::new()
            .name(format!("delay-{dir:?}-read"))
            .spawn(move || {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = match src.read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => 0,
                    };
                    if n > 0 {
                        sh.counters.record(dir, n, &last);
                    }
                    let c = Chunk {
                        due: Instant::now() + sh.delay(),
                        data: buf[..n].to_vec(),
                    };
                    if !q.push(c, sh.buffer) || n == 0 {
                        return;
                    }
                }
            })
    };
    let reader = match reader {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("delay proxy: cannot start a reader thread: {e}");
            unblock_src();
            return;
        }
    };
    loop {
        let c = q.pop();
        let now = Instant::now();
        if c.due > now {
            // The delay itself (what this proxy is for), not a wait for an event.
            std::thread::sleep(c.due - now);
        }
        if c.data.is_empty() {
            let _ = dst.flush();
            on_eof(&mut dst);
            break;
        }
        if dst.write_all(&c.data).and_then(|_| dst.flush()).is_err() {
            q.close();
            unblock_src();
            break;
        }
    }
    if !detach_reader {
        let _ = reader.join();
    }
}

/// One relayed connection: both sockets (to shut them down) and its two relay threads.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

impl Conn {
    fn finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    fn stop(self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Start relaying one accepted connection to `target`.
fn spawn_conn(client: TcpStream, target: SocketAddr, shaping: &Arc<Shaping>) -> io::Result<Conn> {
    let server = TcpStream::connect(target)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    shaping.counters.connections.fetch_add(1, Ordering::Relaxed);
    let last = Arc::new(AtomicU8::new(0));
    let mut threads = Vec::new();
    for (dir, from, to) in [
        (Dir::Up, client.try_clone()?, server.try_clone()?),
        (Dir::Down, server.try_clone()?, client.try_clone()?),
    ] {
        let sh = shaping.clone();
        let last = last.clone();
        let unblock = from.try_clone()?;
        threads.push(
            std::thread::Builder::new()
                .name(format!("delay-{dir:?}"))
                .spawn(move || {
                    relay(
                        from,
                        to,
                        dir,
                        sh,
                        last,
                        |s| {
                            let _ = s.shutdown(Shutdown::Write);
                        },
                        move || {
                            let _ = unblock.shutdown(Shutdown::Both);
                        },
                        false,
                    )
                })?,
        );
    }
    Ok(Conn {
        client,
        server,
        threads,
    })
}

/// A listening delay proxy on 127.0.0.1 relaying every connection to a target. Dropping it
/// stops accepting, shuts every connection down and joins every thread.
pub struct DelayProxy {
    addr: SocketAddr,
    shaping: Arc<Shaping>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<Conn>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl DelayProxy {
    /// Listen on a free port of 127.0.0.1; relay to `target` with `delay` each way.
    pub fn start(target: impl ToSocketAddrs, delay: Duration) -> io::Result<DelayProxy> {
        DelayProxy::start_with(target, delay, DEFAULT_BUFFER, "127.0.0.1:0")
    }

    /// As [`DelayProxy::start`], with the per-direction buffer bound and the listen address.
    pub fn start_with(
        target: impl ToSocketAddrs,
        delay: Duration,
        buffer: usize,
        listen: impl ToSocketAddrs,
    ) -> io::Result<DelayProxy> {
        let target = target.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address for the target")
        })?;
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let shaping = Shaping::new(delay, buffer);
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<Conn>>> = Arc::default();
        let acceptor = {
            let (shaping, stop, conns) = (shaping.clone(), stop.clone(), conns.clone());
            std::thread::Builder::new()
                .name("delay-accept".into())
                .spawn(move || {
                    for c in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let Ok(c) = c else { continue };
                        match spawn_conn(c, target, &shaping) {
                            Ok(conn) => {
                                let mut g = conns.lock().unwrap_or_else(|e| e.into_inner());
                                // Reap finished connections (their threads are done).
                                let (done, live): (Vec<Conn>, Vec<Conn>) =
                                    g.drain(..).partition(Conn::finished);
                                *g = live;
                                g.push(conn);
                                drop(g);
                                done.into_iter().for_each(Conn::stop);
                            }
                            Err(e) => tracing::warn!("delay proxy: connecting to {target}: {e}"),
                        }
                    }
                })?
        };
        Ok(DelayProxy {
            addr,
            shaping,
            stop,
            conns,
            acceptor: Some(acceptor),
        })
    }

    /// The address to connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The traffic so far (all connections).
    pub fn traffic(&self) -> Traffic {
        self.shaping.counters.snapshot()
    }

    pub fn delay(&self) -> Duration {
        self.shaping.delay()
    }

    /// Change the one-way delay (for data read from now on).
    pub fn set_delay(&self, d: Duration) {
        self.shaping.set_delay(d)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor (it checks `stop` after every accept).
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let conns: Vec<Conn> = self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        conns.into_iter().for_each(Conn::stop);
    }
}

/// Relay this process's stdin/stdout to `target` with `delay` each way (ssh's
/// `ProxyCommand`). Returns when the server's side of the stream has ended and was forwarded
/// to stdout (or stdout failed); the caller should then exit (the stdin reader may still be
/// blocked in a read). The traffic is counted in the returned shaping's counters.
pub fn relay_stdio(
    target: impl ToSocketAddrs,
    delay: Duration,
    buffer: usize,
) -> io::Result<Arc<Shaping>> {
    let shaping = Shaping::new(delay, buffer);
    relay_stdio_with(target, shaping.clone())?;
    Ok(shaping)
}

/// As [`relay_stdio`], with settings and counters made by the caller (who may read them
/// meanwhile, e.g. from a signal-handling thread).
pub fn relay_stdio_with(target: impl ToSocketAddrs, shaping: Arc<Shaping>) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    server.set_nodelay(true)?;
    shaping.counters.connections.fetch_add(1, Ordering::Relaxed);
    let last = Arc::new(AtomicU8::new(0));
    let up = {
        let (sh, last) = (shaping.clone(), last.clone());
        let to = server.try_clone()?;
        std::thread::Builder::new()
            .name("delay-Up".into())
            .spawn(move || {
                relay(
                    io::stdin(),
                    to,
                    Dir::Up,
                    sh,
                    last,
                    |s| {
                        let _ = s.shutdown(Shutdown::Write);
                    },
                    || {},
                    true,
                )
            })?
    };
    let unblock = server.try_clone()?;
    relay(
        server,
        io::stdout(),
        Dir::Down,
        shaping,
        last,
        |_| {},
        move || {
            let _ = unblock.shutdown(Shutdown::Both);
        },
        false,
    );
    drop(up);
    Ok(())
}
