//! The remote-tree tooling through the `dircache` binary: `dircache delay-proxy` as ssh's and
//! sshfs's ProxyCommand to a throwaway sshd, and a smoke run of `dircache bench remote`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dircache_tests::cannot_run;
use dircache_tests::child_mount::{is_mounted, ChildMount};
use dircache_tests::sshd::{can_mount_sshfs, sshd_available, sshd_for_test};
use serde_json::Value;

const EXE: &str = env!("CARGO_BIN_EXE_dircache");

#[test]
fn delay_proxy_as_ssh_proxycommand_delays_and_counts() {
    let Some(s) = sshd_for_test() else { return };
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("traffic.jsonl");
    let delay_ms = 20;
    let pc = format!(
        "{EXE} delay-proxy --delay-ms {delay_ms} --stats {} %h:%p",
        stats.display()
    );
    let t0 = Instant::now();
    let o = s
        .ssh(s.port(), Some(&pc), "echo via-proxycommand")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let took = t0.elapsed();
    assert!(
        o.status.success(),
        "{}\nsshd: {}",
        String::from_utf8_lossy(&o.stderr),
        s.log()
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "via-proxycommand\n");
    // The proxy writes its counts when the relay ends, which is when ssh has closed it: by
    // now (ssh waited for its ProxyCommand) or very soon after.
    let t1 = Instant::now();
    let line = loop {
        if let Some(l) = std::fs::read_to_string(&stats)
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string))
        {
            break l;
        }
        assert!(t1.elapsed() < Duration::from_secs(20), "no stats written");
        std::thread::sleep(Duration::from_millis(20));
    };
    let v: Value = serde_json::from_str(&line).unwrap();
    let rt = v["round_trips"].as_u64().unwrap();
    assert!(rt >= 4, "{v}");
    assert!(v["up_bytes"].as_u64().unwrap() > 1000, "{v}");
    let min = Duration::from_millis(2 * delay_ms * 4);
    assert!(took >= min, "{took:?} < {min:?} for {rt} round trips");
}

#[test]
fn sshfs_through_delay_proxy_proxycommand() {
    if !can_mount_sshfs() {
        return;
    }
    let Some(s) = sshd_for_test() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("hello.c"), "int main;\n").unwrap();
    let mnt = dir.path().join("mnt");
    let mut cmd = s.sshfs(s.port(), &tree, &mnt, &[]);
    cmd.arg("-o")
        .arg(format!("ProxyCommand={EXE} delay-proxy --delay-ms 1 %h:%p"));
    let m = ChildMount::start(cmd, &mnt, &dir.path().join("log"), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\nsshd: {}", s.log()));
    assert_eq!(
        std::fs::read_to_string(mnt.join("hello.c")).unwrap(),
        "int main;\n"
    );
    drop(m);
    assert!(!is_mounted(&mnt));
}

#[test]
fn bench_remote_smoke_json() {
    if !can_mount_sshfs() || !sshd_available() {
        if !sshd_available() {
            cannot_run("needs openssh-server");
        }
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let out = Command::new(EXE)
        .args([
            "bench",
            "remote",
            "--quick",
            "--entries",
            "300",
            "--loop-paths",
            "20",
            "--runs",
            "1",
            "--rtt",
            "0,1ms",
            "--json",
            "--systems",
            "native,sshfs,dircache,dircache-local",
            "--base",
        ])
        .arg(base.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench remote failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    // 13 workloads x 4 systems (a local dircache mount among them) x 2 RTTs x cold/warm, and
    // disconnected reads, cached and uncached (warm; native and dircache only) x 2 RTTs.
    assert_eq!(rows.len(), 13 * 4 * 2 * 2 + 2 * 2 * 2, "{rows:#?}");
    for r in &rows {
        for k in ["workload", "system", "rtt_ms", "cache", "median_s"] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        let sys = r["system"].as_str().unwrap();
        if sys == "dircache" && r.get("error").is_some() {
            // Until this binary serves remote sources the row says why it has no result.
            let e = r["error"].as_str().unwrap();
            assert!(e.starts_with("unavailable: "), "{r}");
            continue;
        }
        assert!(r.get("error").is_none(), "{r}");
        let m = r["median_s"].as_f64().unwrap();
        assert!(m > 0.0, "{r}");
        let cut_off = r["workload"]
            .as_str()
            .is_some_and(|w| w.starts_with("disconnected"));
        if sys == "native" || sys == "dircache-local" || cut_off {
            // Native and the local mount have no proxy; disconnected reads run with the
            // proxy stopped.
            assert!(r["round_trips"].is_null(), "{r}");
        } else {
            // Traffic through the proxy was counted; cold runs always reach the server.
            assert!(r["bytes"].as_u64().is_some(), "{r}");
            if r["cache"] == "cold" {
                assert!(r["round_trips"].as_u64().unwrap() > 0, "{r}");
            }
        }
    }
    // The same output on every system (a wrong tree or a broken mount would show).
    for r in &rows {
        let native = rows
            .iter()
            .find(|n| {
                n["system"] == "native"
                    && n["workload"] == r["workload"]
                    && n["cache"] == r["cache"]
                    && n["rtt_ms"] == r["rtt_ms"]
            })
            .unwrap();
        if r.get("error").is_none() {
            assert_eq!(r["output_lines"], native["output_lines"], "{r} vs {native}");
        }
    }
    // Nothing left mounted, the temporary tree removed.
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mi.contains(base.path().to_str().unwrap()), "{mi}");
    assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
}

/// `bench remote --systems native,dircache-local`: a local dircache mount of the served tree
/// beside native, with no ssh; each loop row has its CPU time (the loop's, plus the mount
/// daemon's for dircache), the local mount's rows count its FUSE requests (`--blob-opens`
/// opens of the 1 MB file) and no round trip, the same output as native, and nothing is left
/// mounted.
#[test]
fn bench_remote_local_mount_and_cpu() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/fuse").exists() {
        cannot_run("needs root and /dev/fuse");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let out = Command::new(EXE)
        .args([
            "bench",
            "remote",
            "--quick",
            "--entries",
            "300",
            "--loop-paths",
            "20",
            "--blob-opens",
            "7",
            "--runs",
            "1",
            "--rtt",
            "0",
            "--json",
            "--only",
            "open+read",
            "--systems",
            "native,dircache-local",
            "--base",
        ])
        .arg(base.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench remote failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let local: Vec<&Value> = rows
        .iter()
        .filter(|r| r["system"] == "dircache-local")
        .collect();
    // open+read, its 1 MB and uncached variants, cold and warm (disconnected reads are not
    // a local mount's).
    assert_eq!(local.len(), 6, "{rows:#?}");
    for r in &rows {
        assert!(r.get("error").is_none(), "{r}");
        assert!(r["median_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["cpu_s"].as_f64().is_some_and(|c| c > 0.0), "{r}");
        assert!(r["round_trips"].is_null(), "{r}");
        let native = rows
            .iter()
            .find(|n| {
                n["system"] == "native"
                    && n["workload"] == r["workload"]
                    && n["cache"] == r["cache"]
            })
            .unwrap();
        assert_eq!(r["output_lines"], native["output_lines"], "{r} vs {native}");
    }
    for r in local {
        // Every open of the loop reached the local daemon (OPEN and RELEASE at least).
        let opens = match r["workload"].as_str().unwrap() {
            "open+read 1MB x7" => 7,
            w => {
                assert!(!w.contains("1MB"), "--blob-opens 7 not applied: {r}");
                20
            }
        };
        assert!(
            r["kernel_requests_by_kind"]["open"].as_u64() >= Some(opens),
            "{r}"
        );
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mi.contains(base.path().to_str().unwrap()), "{mi}");
    assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                out.push(format!("{}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    out
}

#[test]
fn bench_remote_interrupted_leaves_nothing_behind() {
    if !can_mount_sshfs() || !sshd_available() {
        if !sshd_available() {
            cannot_run("needs openssh-server");
        }
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let b = base.path().to_str().unwrap().to_string();
    let mut child = Command::new(EXE)
        .args([
            "bench",
            "remote",
            "--quick",
            "--entries",
            "300",
            "--runs",
            "1000",
            "--rtt",
            "1ms",
            "--systems",
            "native,sshfs,sshfs-cache",
            "--base",
            &b,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until both sshfs mounts are up (the bench is running its workloads).
    let t0 = Instant::now();
    loop {
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        if mi.matches(b.as_str()).count() >= 2 {
            break;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("bench exited early: {st}");
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no mounts: {mi}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!processes_mentioning(&b).is_empty());
    // SAFETY: kill(2) of our own child by PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t1 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(60),
            "bench did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!st.success(), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mi.contains(b.as_str()), "left mounted: {mi}");
    // sshd, sshfs, ssh and sftp-server all mention the base directory (keys, paths).
    let t2 = Instant::now();
    loop {
        let left = processes_mentioning(&b);
        if left.is_empty() {
            break;
        }
        assert!(
            t2.elapsed() < Duration::from_secs(10),
            "left running: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
}
