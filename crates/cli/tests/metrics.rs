//! `-o metrics=ADDR:PORT`: the OpenMetrics endpoint of a real background mount, scraped
//! during a workload (counters move as the workload implies, latency histograms count every
//! request), bad requests answered with errors while the server keeps serving, the port
//! freed when the mount ends, and non-loopback addresses refused without `metrics_public`.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::can_mount;

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

/// A background `dircache mount` of a fresh tree, unmounted (and waited for) on drop.
struct Mount {
    dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Mount {
    /// Mount with `opts`; the tree has `d/` (never listed: its misses reach the backend) and
    /// `e/` with 5 files.
    fn new(opts: &str) -> Result<Mount, String> {
        Mount::with(opts, false)
    }

    /// `remote`: SRC as `localhost:SRC`, its server started by a stand-in for ssh.
    fn with(opts: &str, remote: bool) -> Result<Mount, String> {
        let dir = tempfile::tempdir().unwrap();
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::create_dir_all(src.join("e")).unwrap();
        for i in 0..5 {
            std::fs::write(src.join(format!("e/f{i}")), b"x").unwrap();
        }
        std::fs::create_dir(&mnt).unwrap();
        let mut src_arg = src.clone().into_os_string();
        let mut opts = opts.to_string();
        if remote {
            let fake = dircache_tests::remote::stand_in_ssh(dir.path());
            src_arg = format!("localhost:{}", src.display()).into();
            opts.push_str(&format!(
                ",ssh_command={},serve_command={BIN},IdentityFile=/nonexistent/id",
                fake.display()
            ));
        }
        let out = Command::new(BIN)
            .arg("mount")
            .arg(&src_arg)
            .arg(&mnt)
            .args([
                "-o",
                &opts,
                "-o",
                &format!("log={}", dir.path().join("log").display()),
            ])
            .output()
            .unwrap();
        let m = Mount { dir, mnt };
        if !out.status.success() {
            return Err(format!(
                "status {:?}: {} (left mounted: {})",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr),
                dircache_fuse::is_mount_point(&m.mnt)
            ));
        }
        Ok(m)
    }

    fn stats(&self) -> serde_json::Value {
        let out = Command::new(BIN)
            .arg("stats")
            .arg(&self.mnt)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The endpoint's address, as the daemon reports it (`-o metrics=...:0` picks a port).
    fn addr(&self) -> SocketAddr {
        let s = self.stats();
        s["metrics"]
            .as_str()
            .unwrap_or_else(|| panic!("no metrics address in stats: {s}"))
            .parse()
            .unwrap()
    }

    /// `dircache umount` (returns once the daemon has exited).
    fn umount(&self) -> bool {
        Command::new(BIN)
            .arg("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if dircache_fuse::is_mount_point(&self.mnt) && !self.umount() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = &self.dir;
    }
}

/// One HTTP exchange: send `req` as is, return the status code and body.
fn http(addr: SocketAddr, req: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(req).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let resp = String::from_utf8_lossy(&resp).to_string();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {resp:?}"));
    (code, body.to_string())
}

/// `GET /metrics`, parsed: `name{labels}` to value.
fn scrape(addr: SocketAddr) -> HashMap<String, f64> {
    let (code, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics text: {body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse::<f64>().unwrap())
        })
        .collect()
}

fn get(m: &HashMap<String, f64>, key: &str) -> u64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("{key} missing from the scrape")) as u64
}

/// Poll (at most 20 s) until every FUSE opcode's latency histogram counts as many requests
/// as its request counter (requests in flight, e.g. a FORGET or RELEASEDIR after a close,
/// are counted when they start and timed when they end). Returns the last scrape.
fn settled(addr: SocketAddr) -> HashMap<String, f64> {
    let t = Instant::now();
    loop {
        let m = scrape(addr);
        let mut diff = Vec::new();
        for (k, v) in &m {
            if let Some(op) = k
                .strip_prefix("dircache_fuse_requests_total{op=\"")
                .and_then(|r| r.strip_suffix("\"}"))
            {
                let c = format!("dircache_fuse_request_duration_seconds_count{{op=\"{op}\"}}");
                let inf = format!(
                    "dircache_fuse_request_duration_seconds_bucket{{le=\"+Inf\",op=\"{op}\"}}"
                );
                if m.get(&c) != Some(v) || m.get(&inf) != Some(v) {
                    diff.push(format!("{op}: {v} requests, histogram {:?}", m.get(&c)));
                }
            }
        }
        let ops = m
            .keys()
            .filter(|k| k.starts_with("dircache_fuse_requests_total"))
            .count();
        if diff.is_empty() && ops > 0 {
            return m;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "histogram counts differ from request counts: {diff:?} ({ops} opcodes)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn hits(m: &HashMap<String, f64>, kind: &str) -> u64 {
    get(m, &format!("dircache_cache_hits_total{{kind=\"{kind}\"}}"))
}

fn misses(m: &HashMap<String, f64>, kind: &str) -> u64 {
    get(
        m,
        &format!("dircache_cache_misses_total{{kind=\"{kind}\"}}"),
    )
}

fn backend_calls(m: &HashMap<String, f64>, call: &str) -> u64 {
    get(
        m,
        &format!("dircache_backend_call_duration_seconds_count{{call=\"{call}\"}}"),
    )
}

#[test]
fn scrape_follows_a_workload() {
    if !can_mount() {
        return;
    }
    // Every stat and listing reaches the daemon: no kernel negative entries, no kernel
    // listing cache (`opendir`: without OPENDIR the kernel caches listings anyway), no
    // prefetching, no listing on lookups.
    let m = Mount::new(
        "metrics=127.0.0.1:0,negative_timeout=0,opendir,nocache_dir,noprefetch,nolookahead",
    )
    .unwrap();
    let addr = m.addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let _ = std::fs::metadata(m.mnt.join("d")).unwrap();
    let _ = std::fs::metadata(m.mnt.join("e")).unwrap();
    let s0 = settled(addr);

    // N stats of missing names in a directory never listed: the backend says ENOENT once
    // per name, the cached negative entry answers the second round.
    const N: u64 = 20;
    for i in 0..N {
        let e = std::fs::metadata(m.mnt.join(format!("d/missing{i}"))).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
    let s1 = settled(addr);
    assert_eq!(misses(&s1, "negative") - misses(&s0, "negative"), N);
    assert_eq!(hits(&s1, "negative") - hits(&s0, "negative"), 0);
    assert_eq!(
        backend_calls(&s1, "lookup") - backend_calls(&s0, "lookup"),
        N
    );
    let neg = "dircache_fuse_negative_lookups_total";
    assert_eq!(get(&s1, neg) - get(&s0, neg), N);
    for i in 0..N {
        assert!(std::fs::metadata(m.mnt.join(format!("d/missing{i}"))).is_err());
    }
    let s2 = settled(addr);
    assert_eq!(hits(&s2, "negative") - hits(&s1, "negative"), N);
    assert_eq!(misses(&s2, "negative") - misses(&s1, "negative"), 0);
    assert_eq!(
        backend_calls(&s2, "lookup") - backend_calls(&s1, "lookup"),
        0
    );
    assert_eq!(get(&s2, neg) - get(&s1, neg), N);

    // The first listing of e/ reads the backend and makes e/ complete; the next M are
    // listing hits.
    let list = || {
        let mut n: Vec<_> = std::fs::read_dir(m.mnt.join("e"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        n.sort();
        assert_eq!(n.len(), 5);
    };
    list();
    let s3 = settled(addr);
    assert_eq!(misses(&s3, "listing") - misses(&s2, "listing"), 1);
    assert_eq!(
        backend_calls(&s3, "readdir") - backend_calls(&s2, "readdir"),
        1
    );
    const M: u64 = 7;
    for _ in 0..M {
        list();
    }
    let s4 = settled(addr);
    assert_eq!(hits(&s4, "listing") - hits(&s3, "listing"), M);
    assert_eq!(misses(&s4, "listing") - misses(&s3, "listing"), 0);
    assert_eq!(
        backend_calls(&s4, "readdir") - backend_calls(&s3, "readdir"),
        0
    );
    let inval = "dircache_cache_invalidations_total";
    assert_eq!(get(&s4, inval), get(&s0, inval), "nothing changed yet");

    // A chmod of a directory invalidates what lies below it, and is one backend mutation.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(m.mnt.join("e"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let s5 = settled(addr);
    assert!(get(&s5, inval) > get(&s4, inval), "no invalidation counted");
    assert!(backend_calls(&s5, "mutation") > backend_calls(&s4, "mutation"));

    // Histograms are well formed: cumulative buckets ending at the count, a positive sum.
    let op = "readdirplus";
    let count = get(
        &s5,
        &format!("dircache_fuse_request_duration_seconds_count{{op=\"{op}\"}}"),
    );
    assert!(count >= M, "{op}: {count}");
    let mut buckets: Vec<(f64, u64)> = s5
        .iter()
        .filter_map(|(k, v)| {
            let le = k
                .strip_prefix("dircache_fuse_request_duration_seconds_bucket{le=\"")?
                .strip_suffix(&format!("\",op=\"{op}\"}}"))?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, *v as u64))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.len() > 10, "{buckets:?}");
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    assert_eq!(buckets.last().unwrap().1, count);
    let sum = s5[&format!("dircache_fuse_request_duration_seconds_sum{{op=\"{op}\"}}")];
    assert!(sum > 0.0);

    // `dircache stats` shows the same by-kind numbers.
    let text = Command::new(BIN).arg("stats").arg(&m.mnt).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let want = format!(
        "negative {}/{}",
        hits(&s5, "negative"),
        misses(&s5, "negative")
    );
    assert!(
        text.contains("hits/misses by kind:") && text.contains(&want),
        "{want} not in {text}"
    );
    assert!(m.umount());
}

#[test]
fn bad_requests_get_errors_and_the_port_is_freed() {
    if !can_mount() {
        return;
    }
    let m = Mount::new("metrics=127.0.0.1:0").unwrap();
    let addr = m.addr();
    // A client that connects and says nothing holds one slot, not the server.
    let idle = TcpStream::connect(addr).unwrap();
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    for (req, want) in [
        (
            b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n".to_vec(),
            405,
        ),
        (b"GET / HTTP/1.1\r\n\r\n".to_vec(), 404),
        (b"GET /metrics/../etc HTTP/1.1\r\n\r\n".to_vec(), 404),
        (huge.into_bytes(), 431),
        (b"\x00\x01 nonsense\r\n\r\n".to_vec(), 400),
    ] {
        let (code, body) = http(addr, &req);
        assert_eq!(
            code,
            want,
            "{:?}: {body}",
            String::from_utf8_lossy(&req[..req.len().min(40)])
        );
        // Still serving.
        let _ = scrape(addr);
    }
    // Paths never become labels.
    let (_, body) = http(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(!body.contains(m.mnt.to_str().unwrap()));
    drop(idle);
    assert!(m.umount(), "umount");
    assert!(!dircache_fuse::is_mount_point(&m.mnt));
    // The daemon has exited: nothing listens, and the port can be bound again.
    assert!(TcpStream::connect(addr).is_err(), "still listening");
    TcpListener::bind(addr).expect("the port is free");
}

#[test]
fn non_loopback_needs_metrics_public() {
    if !can_mount() {
        return;
    }
    for opt in [
        "metrics=0.0.0.0:0",
        "metrics=[::]:0",
        "metrics=192.0.2.1:9477",
    ] {
        let e = Mount::new(opt)
            .err()
            .unwrap_or_else(|| panic!("{opt} mounted"));
        assert!(
            e.starts_with("status Some(2)") && e.contains("metrics_public"),
            "{opt}: {e}"
        );
    }
    for opt in [
        "metrics=localhost:9477",
        "metrics=127.0.0.1",
        "metrics_public",
    ] {
        let e = Mount::new(opt)
            .err()
            .unwrap_or_else(|| panic!("{opt} mounted"));
        assert!(e.starts_with("status Some(2)"), "{opt}: {e}");
    }
    // Said on purpose: it listens on every address.
    let m = Mount::new("metrics=0.0.0.0:0,metrics_public").unwrap();
    let addr = m.addr();
    assert!(addr.ip().is_unspecified(), "{addr}");
    let _ = scrape(SocketAddr::from(([127, 0, 0, 1], addr.port())));
    assert!(m.umount());
}

#[test]
fn a_port_in_use_fails_the_mount_and_leaves_nothing() {
    if !can_mount() {
        return;
    }
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = Mount::new(&format!("metrics=127.0.0.1:{port}"))
        .err()
        .expect("mounted on a port in use");
    assert!(
        e.starts_with("status Some(1)") && e.contains("metrics"),
        "{e}"
    );
    assert!(e.ends_with("(left mounted: false)"), "{e}");
}

#[test]
fn a_remote_mount_serves_metrics_too() {
    if !can_mount() {
        return;
    }
    let m = Mount::with("metrics=127.0.0.1:0,negative_timeout=0,noprefetch", true).unwrap();
    let addr = m.addr();
    let _ = std::fs::metadata(m.mnt.join("d")).unwrap();
    let s0 = settled(addr);
    for i in 0..10 {
        assert!(std::fs::metadata(m.mnt.join(format!("d/nothere{i}"))).is_err());
    }
    let s1 = settled(addr);
    // Each name went to the server once (a backend lookup answered ENOENT).
    assert_eq!(misses(&s1, "negative") - misses(&s0, "negative"), 10);
    assert_eq!(
        backend_calls(&s1, "lookup") - backend_calls(&s0, "lookup"),
        10
    );
    assert!(m.umount());
    assert!(TcpStream::connect(addr).is_err(), "still listening");
}
