//! What an unprivileged user with write access somewhere in SRC can make the daemon do by
//! changing SRC natively between the kernel's lookup and the daemon's action (docs/security.md
//! P11): the daemon's threads serve every user of the mount, so none of them may be held by
//! what one user puts at a name.

mod common;
use common::*;

use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Run `script` with python as `uid` in the background.
fn spawn_py(dir: &std::path::Path, script: &str, uid: u32) -> Child {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(PY)
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python")
}

/// Wait up to `limit` for `c` to exit; its exit status if it did.
fn wait_exit(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Open every FIFO in `dir` for writing without blocking: a reader blocked in open(2) (a
/// daemon thread, before the fix) wakes up.
fn release_fifos(dir: &std::path::Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_fifo()).unwrap_or(false) {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(e.path());
        }
    }
}

/// A user replaces files it may write in SRC by FIFOs after the kernel looked them up, then
/// opens them through the mount: the kernel, still believing they are regular files, sends
/// OPEN, and the daemon's open(2) of a FIFO without a writer blocked its request thread for
/// good. One such open per request thread (4) and the mount hung for every user: root's stat
/// of another file never returned. Natively the same opens block only the opener (the kernel
/// opens a FIFO itself; the mount's kernel does too once it knows the name is one).
/// No change feed here: the window between the native change and the feed's report, made
/// endless (with the feed, the same race by hand hung all 4 threads in 10 of 10 tries).
#[test]
fn a_fifo_put_at_a_name_never_holds_a_request_thread() {
    if !can_mount() {
        return;
    }
    let t = TestMount::without_feed();
    let threads = dircache_fuse::CachePolicy::default().threads;
    std::fs::create_dir(t.s("w")).unwrap();
    chmod(&t.s("w"), 0o1777);
    std::fs::write(t.s("other"), b"still served\n").unwrap();
    let n = threads + 2;
    for i in 0..n {
        // Made by the user through the mount, so the kernel holds each as a regular file.
        py(
            &t.mnt,
            &format!("open('w/f{i}', 'w').write('x'); import os; os.stat('w/f{i}')"),
            Some(1000),
        );
    }
    // Natively, as the same user: each file replaced by a FIFO (one rename each).
    py(
        &t.src,
        &format!("import os\nfor i in range({n}):\n    os.mkfifo('w/p%d' % i)\n    os.rename('w/p%d' % i, 'w/f%d' % i)\n"),
        Some(1000),
    );
    let mut openers: Vec<Child> = (0..n)
        .map(|i| {
            spawn_py(
                &t.mnt,
                &format!("import os\ntry:\n    os.close(os.open('w/f{i}', os.O_RDONLY))\nexcept OSError as e: print(e)\n"),
                1000,
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Another user's request, on another file.
    let mut probe = spawn_py(
        &t.mnt,
        "import os\nprint(open('other').read(), end='')\nprint(sorted(os.listdir('.')))\n",
        1001,
    );
    let answered = wait_exit(&mut probe, Duration::from_secs(10));
    // Whatever happened: let every blocked open go, then stop the openers.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline
        && openers
            .iter_mut()
            .any(|c| !matches!(c.try_wait(), Ok(Some(_))))
    {
        // A FIFO the kernel opened through the mount is the mount inode's pipe, one the
        // daemon opened is SRC's.
        release_fifos(&t.s("w"));
        release_fifos(&t.m("w"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut opened = Vec::new();
    for mut c in openers {
        let _ = c.kill();
        let o = c.wait_with_output().expect("opener");
        opened.push(format!(
            "{:?} {}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    if answered.is_none() {
        let _ = probe.kill();
    }
    let out = probe.wait_with_output().expect("probe");
    assert!(
        answered.is_some(),
        "uid 1001's read of another file was not answered within 10 s while uid 1000 had {n} \
         opens of FIFOs put at names the kernel held as regular files ({threads} request threads)"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "still served\n['other', 'w']\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each open then went as natively: the kernel, told the name is another inode, looked it
    // up again and opened the FIFO itself (it blocked the opener until released, then
    // succeeded).
    assert!(
        opened.iter().all(|o| o == "Some(0) "),
        "the openers: {opened:?}"
    );
}

/// A user takes write leases (`F_SETLEASE F_WRLCK`) on its own files in SRC, ignores the
/// SIGIO that asks it to give them up, and opens each file through the mount: every OPEN
/// waits for the lease's break, which the kernel forces only after
/// `/proc/sys/fs/lease-break-time` (45 s). Natively each open blocks its opener for that long;
/// through the mount each held a daemon request thread as long, so one user with a few leases
/// stopped the mount for every user, again and again. Another user's read of another file must
/// still be answered at once.
#[test]
fn leases_on_own_files_never_hold_the_request_threads() {
    if !can_mount() {
        return;
    }
    let break_time: u64 = std::fs::read_to_string("/proc/sys/fs/lease-break-time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if break_time < 15 {
        cannot_run("lease-break-time below 15 s: a held thread would free itself too soon");
        return;
    }
    let t = TestMount::new();
    let threads = dircache_fuse::CachePolicy::default().threads;
    std::fs::create_dir(t.s("w")).unwrap();
    chmod(&t.s("w"), 0o1777);
    std::fs::write(t.s("other"), b"still served\n").unwrap();
    let n = threads + 2;
    let how = "os.O_RDONLY";
    // The holder, natively in SRC as uid 1000: one write lease per file, SIGIO ignored; it
    // prints "held" and keeps its leases until its stdin closes.
    let mut holder = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", PY, "-c"])
        .arg(format!(
            "import os, fcntl, signal, sys\n\
             signal.signal(signal.SIGIO, signal.SIG_IGN)\n\
             fds = []\n\
             for i in range({n}):\n    \
                 open('w/f%d' % i, 'w').write('x')\n    \
                 fd = os.open('w/f%d' % i, os.O_RDONLY)\n    \
                 fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n    \
                 fds.append(fd)\n\
             print('held', flush=True)\n\
             sys.stdin.read()\n"
        ))
        .current_dir(&t.src)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut line = String::new();
    {
        use std::io::BufRead;
        let out = holder.stdout.take().expect("holder stdout");
        std::io::BufReader::new(out).read_line(&mut line).ok();
    }
    if line.trim() != "held" {
        let _ = holder.kill();
        let o = holder.wait_with_output().expect("holder");
        panic!(
            "the holder took no leases: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The same user opens each leased file through the mount.
    let mut openers: Vec<Child> = (0..n)
        .map(|i| {
            spawn_py(
                &t.mnt,
                &format!("import os\ntry:\n    os.close(os.open('w/f{i}', {how}))\nexcept OSError as e: print(e)\n"),
                1000,
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1000));
    let mut probe = spawn_py(
        &t.mnt,
        "import os\nprint(open('other').read(), end='')\nprint(sorted(os.listdir('.')))\n",
        1001,
    );
    let started = Instant::now();
    let answered = wait_exit(&mut probe, Duration::from_secs(10));
    let took = started.elapsed();
    // The opens still wait for the leases' break, as natively.
    let waiting = openers
        .iter_mut()
        .map(|c| matches!(c.try_wait(), Ok(None)))
        .filter(|w| *w)
        .count();
    // Let the leases go: every open then completes.
    drop(holder.stdin.take());
    let _ = wait_exit(&mut holder, Duration::from_secs(10));
    let _ = holder.kill();
    let _ = holder.wait();
    let mut opened = Vec::new();
    for mut c in openers {
        let done = wait_exit(&mut c, Duration::from_secs(break_time + 10));
        if done.is_none() {
            let _ = c.kill();
        }
        let o = c.wait_with_output().expect("opener");
        opened.push(format!(
            "{:?} {}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    if answered.is_none() {
        let _ = probe.kill();
    }
    let out = probe.wait_with_output().expect("probe");
    assert!(
        answered.is_some(),
        "uid 1001's read of another file was not answered within {took:?} while uid 1000 had \
         {n} opens ({how}) of its own leased files waiting ({threads} request threads)"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "still served\n['other', 'w']\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        waiting, n,
        "opens of leased files that did not wait for the leases' break"
    );
    // Each open then succeeded, as natively once the lease is gone.
    assert!(
        opened.iter().all(|o| o == "Some(0) "),
        "the openers: {opened:?}"
    );
}
