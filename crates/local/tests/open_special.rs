//! `Backend::open` of the local backend never waits on what a user put at a name: the kernel
//! sends OPEN and CREATE only for regular files and directories, so a FIFO or socket found
//! there is another inode (ESTALE) and is not waited on; a regular file with a lease still
//! waits for the lease's break, as a blocking open(2) does (docs/security.md P11).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dircache_core::{Backend, Cred, Error};
use dircache_local::LocalBackend;

fn root() -> Cred {
    Cred::new(0, 0, [])
}

/// Run `f` on a thread; its result if it finished within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_fifo_or_socket_is_refused_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().to_path_buf();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        r.join("fifo"),
        rustix::fs::Mode::from(0o666),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(r.join("sock")).unwrap();
    let b = std::sync::Arc::new(LocalBackend::new(&r).unwrap());
    for (name, flags) in [
        ("fifo", libc::O_RDONLY),
        ("fifo", libc::O_WRONLY),
        ("fifo", libc::O_RDWR),
        ("fifo", libc::O_WRONLY | libc::O_CREAT),
        ("sock", libc::O_RDONLY),
    ] {
        let b = b.clone();
        let got = within(Duration::from_secs(5), move || {
            let mode = if flags & libc::O_CREAT != 0 { 0o644 } else { 0 };
            b.open(&root(), name.as_bytes(), flags, mode).map(drop)
        });
        assert_eq!(
            got,
            Some(Err(Error::Stale)),
            "open of {name} with flags {flags:#o} (None: still waiting after 5 s)"
        );
    }
    // Nor through `open_verified` (a FIFO is never the inode the kernel named; unchecked,
    // it is refused too).
    for expect in [None, Some((0u64, 0u64))] {
        let b = b.clone();
        let got = within(Duration::from_secs(5), move || {
            let t = dircache_core::XattrTarget {
                path: b"fifo",
                expect,
                birth: 0,
                open: None,
            };
            b.open_verified(&root(), t, libc::O_RDONLY).map(drop)
        });
        assert_eq!(
            got,
            Some(Err(Error::Stale)),
            "open_verified, expect {expect:?}"
        );
    }
    // A regular file's descriptor keeps the caller's blocking mode.
    std::fs::write(r.join("f"), b"x").unwrap();
    let f = b.open(&root(), b"f", libc::O_RDONLY, 0).unwrap();
    let fl = rustix::fs::fcntl_getfl(f.fd().unwrap()).unwrap();
    assert!(!fl.contains(rustix::fs::OFlags::NONBLOCK));
    let f = b
        .open(&root(), b"f", libc::O_RDONLY | libc::O_NONBLOCK, 0)
        .unwrap();
    let fl = rustix::fs::fcntl_getfl(f.fd().unwrap()).unwrap();
    assert!(fl.contains(rustix::fs::OFlags::NONBLOCK));
}

/// A read lease held by another process: an open for writing waits for its break and
/// succeeds, as natively (O_NONBLOCK alone would have answered EAGAIN).
#[test]
fn an_open_waits_for_a_lease_break_as_natively() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().to_path_buf();
    std::fs::write(r.join("leased"), b"x").unwrap();
    // The holder releases its lease when told to break it (SIGIO).
    let holder = "import fcntl, os, signal, sys, time\n\
                  fd = os.open('leased', os.O_RDONLY)\n\
                  def brk(s, f):\n    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK); print('broken', flush=True)\n\
                  signal.signal(signal.SIGIO, brk)\n\
                  fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n\
                  print('held', flush=True)\n\
                  time.sleep(30)\n";
    let mut h = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(holder)
        .current_dir(&r)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = BufReader::new(h.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "held\n");
    let b = LocalBackend::new(&r).unwrap();
    let t = Instant::now();
    let got = b.open(&root(), b"leased", libc::O_WRONLY, 0).map(drop);
    let took = t.elapsed();
    line.clear();
    let _ = out.read_line(&mut line);
    let _ = h.kill();
    let _ = h.wait();
    assert_eq!(got, Ok(()), "open for writing of a leased file");
    assert_eq!(line, "broken\n");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}
