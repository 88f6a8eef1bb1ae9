//! `-o metrics=ADDR:PORT`: the mount's counters and latency histograms as OpenMetrics text
//! (which Prometheus scrapes) over HTTP at `GET /metrics`.
//!
//! What is exported is what `dircache stats` shows, encoded by `prometheus-client` at each
//! scrape from the live counters (nothing is copied on the request path): hits and misses by
//! kind (the Coda MiniCache paper's Table 2: names, attributes, access checks, symlinks,
//! negative entries, listings, component walks), FUSE requests and their latency by opcode,
//! backend calls and their latency by kind, invalidations, the notifier, sizes. Labels are
//! fixed names (opcodes, kinds): never a path, a file name or a user.
//!
//! The server is small and bounded: one listener thread; at most [`MAX_CONNECTIONS`]
//! connections served at once (a thread each; more are closed at once); each has
//! [`REQUEST_TIMEOUT`] to send a request head of at most [`MAX_REQUEST`] bytes; one request
//! per connection. Only `GET /metrics` is answered (other paths 404, other methods 405, a
//! head too large 431, a malformed one 400). Dropping the [`MetricsServer`] (the mount ends)
//! stops the listener and frees the port.
//!
//! The endpoint has no authentication, and its numbers tell who does what when on the mount
//! (request rates and timings of every user): by default it may listen on loopback only; the
//! mount option parser refuses other addresses unless `-o metrics_public` says so.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dircache_core::stats::HistogramSnapshot;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::stats::{Op, StatsSource};

/// Connections served at once; more are closed without an answer.
pub const MAX_CONNECTIONS: usize = 4;
/// Largest request head (request line and headers) accepted.
pub const MAX_REQUEST: usize = 8 * 1024;
/// Time a client has to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The OpenMetrics text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether `addr` may be listened on without `-o metrics_public`: loopback only.
pub fn is_private(addr: &SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(a) => a.ip().is_loopback(),
        SocketAddr::V6(a) => {
            a.ip().is_loopback() || a.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The bound listener, before the mount exists (a port in use fails the mount early).
pub struct MetricsListener(TcpListener);

impl MetricsListener {
    pub fn bind(addr: SocketAddr) -> std::io::Result<MetricsListener> {
        TcpListener::bind(addr).map(MetricsListener)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// The running endpoint; dropping it stops the listener and frees the port.
pub struct MetricsServer {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub addr: SocketAddr,
}

impl MetricsServer {
    /// Serve `src`'s counters on `l` from a thread of its own.
    pub fn start(l: MetricsListener, src: StatsSource) -> std::io::Result<MetricsServer> {
        let addr = l.local_addr()?;
        let listener = Arc::new(l.0);
        let stop = Arc::new(AtomicBool::new(false));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Collector(Arc::new(src))));
        let registry = Arc::new(registry);
        let (l2, stop2) = (listener.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("dircache-metrics".into())
            .spawn(move || listen(&l2, &stop2, &registry))?;
        tracing::info!("metrics on http://{addr}/metrics");
        Ok(MetricsServer {
            listener,
            stop,
            thread: Some(thread),
            addr,
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: shutdown on a listening socket this server owns; on Linux it wakes the
        // thread blocked in accept(2), which then sees `stop`.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener thread: take connections, serve each in a thread while slots last.
fn listen(l: &TcpListener, stop: &AtomicBool, registry: &Arc<Registry>) {
    let busy = Arc::new(AtomicUsize::new(0));
    for conn in l.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("metrics accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            busy.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!("metrics connection refused: {MAX_CONNECTIONS} being served");
            continue;
        }
        let (busy2, reg) = (busy.clone(), registry.clone());
        let r = std::thread::Builder::new()
            .name("dircache-metrics-conn".into())
            .spawn(move || {
                serve(s, &reg);
                busy2.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = r {
            busy.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("metrics connection thread: {e}");
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics,
    BadRequest,
    TooLarge,
    NotFound,
    BadMethod,
}

/// Judge a complete request head.
fn judge(head: &[u8]) -> Asked {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => return Asked::TooLarge,
        _ => return Asked::BadRequest,
    }
    if req.method != Some("GET") {
        return Asked::BadMethod;
    }
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path == "/metrics" {
        Asked::Metrics
    } else {
        Asked::NotFound
    }
}

/// Read a request head (up to the blank line), within [`MAX_REQUEST`] bytes and
/// [`REQUEST_TIMEOUT`].
fn read_head(s: &mut TcpStream) -> Result<Vec<u8>, Asked> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end + 4);
            return Ok(buf);
        }
        if buf.len() > MAX_REQUEST {
            return Err(Asked::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return Err(Asked::BadRequest);
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return Err(Asked::BadRequest),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Answer one connection's request and close it.
fn serve(mut s: TcpStream, registry: &Registry) {
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let asked = match read_head(&mut s) {
        Ok(head) => judge(&head),
        Err(a) => a,
    };
    let (status, ctype, body, extra) = match asked {
        Asked::Metrics => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => ("200 OK", CONTENT_TYPE, body, ""),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n".into(),
                    "",
                ),
            }
        }
        Asked::BadRequest => ("400 Bad Request", "text/plain", "bad request\n".into(), ""),
        Asked::TooLarge => (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request too large\n".into(),
            "",
        ),
        Asked::NotFound => (
            "404 Not Found",
            "text/plain",
            "only /metrics is served here\n".into(),
            "",
        ),
        Asked::BadMethod => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".into(),
            "Allow: GET\r\n",
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body.as_bytes());
    let _ = s.flush();
    // A lingering close: take (a bounded amount of) what the client still sends, so that
    // closing with unread data does not reset the connection before it read the answer.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut sink = [0u8; 4096];
    let mut left = 16 * MAX_REQUEST;
    while left > 0 {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Encodes a [`StatsSource`] at each scrape.
struct Collector(Arc<StatsSource>);

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dircache metrics collector")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    m.encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    m.encode_gauge(&v)
}

/// One labelled counter family: `(label value, count)` pairs under `label`.
fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    vs: &[(&str, u64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (k, v) in vs {
        let labels = [(label, *k)];
        m.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

fn histogram(
    m: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
    h: &HistogramSnapshot,
) -> std::fmt::Result {
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .enumerate()
        .map(|(k, n)| (HistogramSnapshot::bound_secs(k), *n))
        .collect();
    m.encode_family(labels)?.encode_histogram::<NoLabelSet>(
        h.sum_ns as f64 * 1e-9,
        h.count(),
        &buckets,
        None::<&HashMap<usize, _>>,
    )
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let src = &self.0;
        let c = src.cache.stats();
        let r = &src.requests;
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        // Table 2 of the Coda MiniCache paper, for this cache: each kind of question the
        // kernel (or a whole-path caller) asks, answered from the cache or not.
        counters(
            &mut e,
            "dircache_cache_hits",
            "Questions answered from the cache, by kind: lookup (names, any path), access (prefix-check cache confirming a whole-path fast-path hit), attr (attributes), symlink (targets), negative (names known missing), listing (readdir of a complete directory), walk (component-at-a-time walks needing no backend call)",
            "kind",
            &[
                ("lookup", c.hits),
                ("access", c.fastpath_hits),
                ("attr", c.attr_hits),
                ("symlink", c.symlink_hits),
                ("negative", c.negative_hits),
                ("listing", c.readdir_hits),
                ("walk", c.walk_hits),
            ],
        )?;
        counters(
            &mut e,
            "dircache_cache_misses",
            "Questions that needed the backend, by kind (as dircache_cache_hits); access: fast-path hits the prefix-check cache could not confirm; negative: names the backend answered ENOENT for",
            "kind",
            &[
                ("lookup", c.misses),
                ("access", c.pcc_misses),
                ("attr", c.attr_misses),
                ("symlink", c.symlink_misses),
                ("negative", c.negative_misses),
                ("listing", c.readdir_misses),
                ("walk", c.walk_misses),
            ],
        )?;
        counter(
            &mut e,
            "dircache_cache_slowpath_walks",
            "Component-at-a-time walks",
            c.slowpath_walks,
        )?;
        counter(
            &mut e,
            "dircache_cache_invalidations",
            "Subtree invalidations (chmod, rename, ... and changes reported by the backend)",
            c.invalidations,
        )?;
        counter(
            &mut e,
            "dircache_cache_invalidated_entries",
            "Cache entries whose version the invalidations bumped",
            c.invalidated_entries,
        )?;
        counter(
            &mut e,
            "dircache_cache_evictions",
            "Cache entries evicted",
            c.evictions,
        )?;
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        gauge(
            &mut e,
            "dircache_cache_entries",
            "Cache entries (dentries) alive",
            g(c.entries),
        )?;
        gauge(
            &mut e,
            "dircache_cache_fast_entries",
            "Entries of the direct-lookup table",
            g(c.fast_entries),
        )?;
        gauge(
            &mut e,
            "dircache_cache_bytes",
            "Estimated bytes held by the cache",
            g(c.bytes),
        )?;
        {
            let mut m = e.encode_descriptor(
                "dircache_backend_call_duration_seconds",
                "Backend calls by kind and how long they took (_count: the number of calls)",
                None,
                MetricType::Histogram,
            )?;
            for (k, h) in src.cache.backend_latency() {
                histogram(&mut m, &[("call", k)], &h)?;
            }
        }
        let seen: Vec<Op> = Op::ALL
            .iter()
            .copied()
            .filter(|op| r.get(*op) > 0)
            .collect();
        let by_op: Vec<(&str, u64)> = seen.iter().map(|op| (op.name(), r.get(*op))).collect();
        counters(
            &mut e,
            "dircache_fuse_requests",
            "FUSE requests by opcode (opcodes seen at least once)",
            "op",
            &by_op,
        )?;
        {
            let mut m = e.encode_descriptor(
                "dircache_fuse_request_duration_seconds",
                "Time to serve a FUSE request, by opcode (opcodes seen at least once)",
                None,
                MetricType::Histogram,
            )?;
            for op in &seen {
                histogram(&mut m, &[("op", op.name())], &r.latency(*op))?;
            }
        }
        counter(
            &mut e,
            "dircache_fuse_negative_lookups",
            "LOOKUP requests answered ENOENT",
            ld(&r.negative_lookups),
        )?;
        counter(
            &mut e,
            "dircache_fuse_passthrough_opens",
            "Opens answered with FUSE passthrough",
            ld(&r.passthrough_opens),
        )?;
        counter(
            &mut e,
            "dircache_fuse_acl_memo_hits",
            "POSIX ACL fetches answered from the memo of known absences",
            ld(&r.acl_memo_hits),
        )?;
        gauge(
            &mut e,
            "dircache_fuse_kernel_inodes",
            "Nodeids the kernel holds",
            g((src.kernel_inodes)() as u64),
        )?;
        counter(
            &mut e,
            "dircache_prefetch_listings",
            "Listings fetched ahead of a tree walk",
            ld(&r.prefetch_listings),
        )?;
        counter(
            &mut e,
            "dircache_prefetch_dropped",
            "Prefetch jobs dropped (queue full)",
            ld(&r.prefetch_dropped),
        )?;
        gauge(
            &mut e,
            "dircache_prefetch_pending",
            "Prefetch jobs queued or running",
            g(r.prefetch_pending.load(Ordering::Acquire)),
        )?;
        counter(
            &mut e,
            "dircache_notifier_changes",
            "Changes received from the backend's change feed",
            ld(&r.changes),
        )?;
        counter(
            &mut e,
            "dircache_notifier_own_writes",
            "Of those, reports of writes made through the mount",
            ld(&r.own_writes),
        )?;
        counters(
            &mut e,
            "dircache_notifier_notifications",
            "Invalidations sent to the kernel, by kind",
            "kind",
            &[
                ("inval_entry", ld(&r.notify_inval_entry)),
                ("inval_inode", ld(&r.notify_inval_inode)),
                ("inc_epoch", ld(&r.notify_inc_epoch)),
            ],
        )?;
        counter(
            &mut e,
            "dircache_notifier_errors",
            "Kernel notifications that failed",
            ld(&r.notify_errors),
        )?;
        // A remote mount's disconnected operation (dircache_remote::client::disconnected).
        let b = src.cache.backend().counters();
        if let Some((_, n)) = b.iter().find(|(k, _)| *k == "conflicts") {
            counter(
                &mut e,
                "dircache_remote_conflicts",
                "Conflicts found reintegrating changes made while disconnected (each local \
                 version kept beside the server's)",
                *n,
            )?;
        }
        gauge(
            &mut e,
            "dircache_resident_memory_bytes",
            "Resident set size of the daemon",
            g(crate::stats::rss_bytes()),
        )?;
        let mut m = e.encode_descriptor(
            "dircache_uptime_seconds",
            "Seconds since the mount began",
            None,
            MetricType::Gauge,
        )?;
        m.encode_gauge(&src.started.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_judged() {
        assert_eq!(
            judge(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics
        );
        assert_eq!(judge(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Asked::Metrics);
        assert_eq!(judge(b"POST /metrics HTTP/1.1\r\n\r\n"), Asked::BadMethod);
        assert_eq!(judge(b"HEAD /metrics HTTP/1.1\r\n\r\n"), Asked::BadMethod);
        assert_eq!(judge(b"GET / HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(judge(b"GET /metrics/x HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(judge(b"garbage\r\n\r\n"), Asked::BadRequest);
    }

    #[test]
    fn only_loopback_is_private() {
        for (a, private) in [
            ("127.0.0.1:9", true),
            ("127.3.2.1:9", true),
            ("[::1]:9", true),
            ("[::ffff:127.0.0.1]:9", true),
            ("0.0.0.0:9", false),
            ("[::]:9", false),
            ("192.168.1.2:9", false),
        ] {
            assert_eq!(is_private(&a.parse().unwrap()), private, "{a}");
        }
    }
}
