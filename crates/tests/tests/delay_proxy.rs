//! The TCP delay proxy (`dircache_tests::delay_proxy`): delay each way, order and content kept,
//! throughput not collapsed, bounded buffers, traffic counts, clean shutdown.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dircache_tests::delay_proxy::DelayProxy;

/// A server on 127.0.0.1 handling one connection with `f`.
fn serve_one(f: impl FnOnce(TcpStream) + Send + 'static) -> (u16, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        f(s)
    });
    (port, h)
}

/// Echo until end of stream, then close.
fn echo(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(31) % 251) as u8
}

#[test]
fn ping_pong_rtt_is_at_least_twice_the_delay_and_counted() {
    let delay = Duration::from_millis(20);
    let (port, server) = serve_one(echo);
    let proxy = DelayProxy::start(("127.0.0.1", port), delay).unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_nodelay(true).unwrap();
    let before = proxy.traffic();
    let mut rtts = Vec::new();
    for i in 0..10u8 {
        let t = Instant::now();
        c.write_all(&[i]).unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        rtts.push(t.elapsed());
        assert_eq!(b[0], i);
    }
    let t = proxy.traffic().since(&before);
    rtts.sort();
    let (min, median) = (rtts[0], rtts[rtts.len() / 2]);
    assert!(
        min >= 2 * delay,
        "a round trip took {min:?} < 2 x {delay:?}"
    );
    // Delayed, not much more: a generous margin for a loaded machine.
    assert!(
        median < 2 * delay + Duration::from_millis(60),
        "median round trip {median:?} with a {delay:?} one-way delay"
    );
    assert_eq!((t.up_bytes, t.down_bytes), (10, 10), "{t:?}");
    assert_eq!(t.round_trips(), 10, "{t:?}");
    assert_eq!(t.down_bursts, 10, "{t:?}");
    assert_eq!(proxy.traffic().connections, 1);
    c.shutdown(Shutdown::Write).unwrap();
    // The half-close reaches the server (delayed): echo returns, closes, we read EOF.
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    server.join().unwrap();
}

#[test]
fn bulk_transfer_keeps_order_and_throughput() {
    let delay = Duration::from_millis(20);
    const TOTAL: u64 = 64 << 20;
    // The sink checks every byte against the pattern (order and content), then answers with
    // the count once the sender's end of stream arrives.
    let (port, server) = serve_one(|mut s| {
        let mut buf = vec![0u8; 1 << 16];
        let mut at = 0u64;
        let mut bad = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b != pattern(at) {
                    bad += 1;
                }
                at += 1;
            }
        }
        s.write_all(format!("{at} {bad}").as_bytes()).unwrap();
    });
    let proxy = DelayProxy::start(("127.0.0.1", port), delay).unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    let t0 = Instant::now();
    for part in data.chunks(1 << 20) {
        c.write_all(part).unwrap();
    }
    c.shutdown(Shutdown::Write).unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    let took = t0.elapsed();
    server.join().unwrap();
    assert_eq!(
        answer,
        format!("{TOTAL} 0"),
        "bytes received, bytes out of place"
    );
    // Serialized per 64 KiB chunk and round trip this would take 1024 x 20 ms = 20 s; pipelined
    // it is one delay plus the copy. 64 MiB in < 4 s is >= 16 MiB/s even on a loaded machine.
    assert!(
        took < Duration::from_secs(4),
        "64 MiB through a 20 ms proxy took {took:?}: throughput collapsed"
    );
    assert!(
        took >= 2 * delay,
        "{took:?}: data then the answer, each delayed"
    );
    let t = proxy.traffic();
    assert_eq!(t.up_bytes, TOTAL);
    eprintln!(
        "64 MiB in {took:?} ({:.0} MiB/s); {t:?}",
        64.0 / took.as_secs_f64()
    );
}

#[test]
fn buffers_are_bounded_and_drop_stops_a_stuck_connection() {
    // A server that accepts and never reads: the proxy may queue at most its buffer, so the
    // sender blocks after (socket buffers + buffer) bytes instead of handing everything over.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        held_tx.send(s).unwrap();
    });
    let buffer = 1 << 20;
    let proxy = DelayProxy::start_with(
        ("127.0.0.1", port),
        Duration::from_millis(1),
        buffer,
        "127.0.0.1:0",
    )
    .unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    const LIMIT: u64 = 512 << 20;
    let writer = {
        let sent = sent.clone();
        std::thread::spawn(move || {
            let chunk = vec![7u8; 1 << 16];
            while sent.load(Ordering::SeqCst) < LIMIT {
                if c.write_all(&chunk).is_err() {
                    return;
                }
                sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        })
    };
    // Wait until the sender is stuck: no progress for 1 s (or it sent everything).
    let t0 = Instant::now();
    let mut last = (0u64, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = sent.load(Ordering::SeqCst);
        if now >= LIMIT || writer.is_finished() {
            break;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(1) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no verdict in 60 s");
    }
    let stuck_at = sent.load(Ordering::SeqCst);
    // Loopback socket buffers hold a few MiB each (client send, proxy receive, proxy send,
    // server receive); the proxy itself 1 MiB per direction.
    assert!(
        stuck_at < 64 << 20,
        "the sender handed {stuck_at} bytes to a proxy whose peer reads nothing"
    );
    assert!(stuck_at >= buffer as u64, "only {stuck_at} bytes sent");
    // Dropping the proxy shuts the connection down: the blocked writer fails and returns.
    let t1 = Instant::now();
    drop(proxy);
    writer.join().unwrap();
    assert!(t1.elapsed() < Duration::from_secs(30));
    drop(held_rx.recv().unwrap());
    server.join().unwrap();
    eprintln!("sender stuck after {stuck_at} bytes");
}

#[test]
fn set_delay_applies_to_later_data() {
    let (port, server) = serve_one(echo);
    let proxy = DelayProxy::start(("127.0.0.1", port), Duration::ZERO).unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_nodelay(true).unwrap();
    let rtt = |c: &mut TcpStream| {
        let t = Instant::now();
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        t.elapsed()
    };
    rtt(&mut c);
    proxy.set_delay(Duration::from_millis(30));
    assert_eq!(proxy.delay(), Duration::from_millis(30));
    let slow = rtt(&mut c);
    assert!(slow >= Duration::from_millis(60), "{slow:?}");
    drop(c);
    server.join().unwrap();
}
