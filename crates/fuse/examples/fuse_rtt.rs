//! `fuse_rtt`: what one FUSE round trip costs over `/dev/fuse` read/write and over FUSE over
//! io_uring, side by side on this machine (docs/opens.md, "FUSE over io_uring").
//!
//! Not a product: the smallest FUSE server that answers INIT, LOOKUP, GETATTR, OPEN, FLUSH,
//! RELEASE and STATFS for a fixed tree (a root directory holding `f0` … `f{N-1}`, empty regular
//! files), written straight against the kernel's wire format so that both transports run the
//! same handler. Two mounts are served at once, one per transport; the client loops (open+close
//! and stat of distinct names, with entry and attribute timeouts of 0 so every step is a round
//! trip) run against each in rotating order per round, and the medians over the rounds are
//! printed with the requests each loop sent (counted by the server).
//!
//! io_uring transport (kernel `fs/fuse/dev_uring.c`, protocol 7.42+): the INIT reply carries
//! `FUSE_OVER_IO_URING` (flags2 bit 9); then per queue (one per possible CPU) ring entries are
//! registered with `IORING_OP_URING_CMD` SQE128 commands (`FUSE_IO_URING_CMD_REGISTER`, the
//! command area holding `struct fuse_uring_cmd_req`, `addr`/`len` an iovec of two buffers: the
//! 288-byte `struct fuse_uring_req_header` and a payload buffer). A completion means a request is
//! in the entry's buffers; the reply goes back in the same buffers with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next request. FORGETs and
//! INTERRUPTs still come over `/dev/fuse`, which keeps its reader thread.
//!
//! Needs root and `/dev/fuse`. The io_uring transport needs
//! `/sys/module/fuse/parameters/enable_uring` = Y: the program sets it for its run and puts the
//! old value back when it ends (also on error or panic). Every mount is aborted
//! (`/sys/fs/fuse/connections/N/abort`, where fusectl is mounted) and detached when the
//! program ends; its `/dev/fuse` descriptor closes with the process, which ends the
//! connection in any case.
//!
//! ```text
//! cargo run --release -p dircache-fuse --example fuse_rtt -- --rounds 9 --iters 3000
//! ```

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use io_uring::{cqueue, opcode, squeue, types, IoUring};

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_OPEN: u32 = 14;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;

const FUSE_INIT_EXT: u32 = 1 << 30;
const FUSE_MAX_PAGES: u32 = 1 << 22;
/// `FUSE_OVER_IO_URING` is bit 41 of the 64 INIT flags: bit 9 of `flags2`.
const FUSE_OVER_IO_URING_FLAGS2: u32 = 1 << 9;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const MAX_WRITE: u32 = 128 * 1024;
const MAX_PAGES: u16 = 32;
/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// `enum fuse_uring_cmd`.
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, `struct fuse_uring_ent_in_out`
/// (flags u64, commit_id u64, payload_sz u32, padding u32, reserved u64).
const RING_HEADER: usize = 288;
const RING_OP_IN: usize = 128;
const RING_ENT_COMMIT_ID: usize = 256 + 8;
const RING_ENT_PAYLOAD_SZ: usize = 256 + 16;
/// Larger than the kernel's `max_payload_sz` for our INIT reply (max of 8 KiB, `max_write`,
/// `max_pages` pages).
const RING_PAYLOAD: usize = 256 * 1024;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

#[derive(Parser, Debug, Clone)]
#[command(about = "µs per FUSE round trip over /dev/fuse and over io_uring, side by side")]
struct Args {
    /// Rounds; each runs every loop on every transport, in rotating order.
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Operations per loop (and files in the tree).
    #[arg(long, default_value_t = 3000)]
    iters: usize,
    /// Client threads sharing each loop's operations (µs/op is then elapsed time over all
    /// operations: the inverse of throughput).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Threads reading /dev/fuse for the /dev/fuse transport (cloned descriptors).
    #[arg(long, default_value_t = 1)]
    dev_threads: usize,
    /// Ring entries registered per queue (one queue per possible CPU, one thread per queue).
    #[arg(long, default_value_t = 2)]
    depth: usize,
    /// Transports to measure, each its own mount, comma-separated: `dev` (/dev/fuse read and
    /// write; `dev+tN`: N reading threads on cloned descriptors, as fuser's `n_threads`),
    /// `uring` (FUSE over io_uring), `uring+pin` (each queue's thread pinned to its
    /// CPU, as libfuse does), `uring+coop` (IORING_SETUP_COOP_TASKRUN), `uring+defer`
    /// (SINGLE_ISSUER + DEFER_TASKRUN); `+` options combine (`uring+pin+defer`).
    #[arg(
        long,
        default_value = "dev,uring,uring+pin,uring+defer,uring+pin+defer"
    )]
    transports: String,
}

#[derive(Clone, PartialEq, Eq, Debug)]
struct Transport {
    name: String,
    uring: bool,
    pin: bool,
    /// Threads reading /dev/fuse (`dev+tN`; the ring has one thread per queue).
    threads: usize,
    /// none, coop, defer
    setup: &'static str,
}

impl Transport {
    fn parse(spec: &str, dev_threads: usize) -> Result<Self> {
        let mut words = spec.split('+');
        let uring = match words.next() {
            Some("dev") => false,
            Some("uring") => true,
            _ => bail!("unknown transport {spec} (dev, uring[+pin][+coop|+defer])"),
        };
        let mut t = Transport {
            name: spec.to_owned(),
            uring,
            pin: false,
            threads: dev_threads,
            setup: "none",
        };
        for w in words {
            match (uring, w) {
                (true, "pin") => t.pin = true,
                (true, "coop") => t.setup = "coop",
                (true, "defer") => t.setup = "defer",
                (false, w)
                    if w.starts_with('t') && w[1..].parse::<usize>().is_ok_and(|n| n > 0) =>
                {
                    t.threads = w[1..].parse()?
                }
                _ => bail!("unknown transport option {w} in {spec}"),
            }
        }
        Ok(t)
    }
}

/// Puts `enable_uring` back to what it was when dropped.
struct EnableUring {
    old: String,
}

impl EnableUring {
    fn on() -> Result<Self> {
        let old = std::fs::read_to_string(ENABLE_URING)
            .with_context(|| format!("{ENABLE_URING}: FUSE over io_uring not compiled in?"))?;
        std::fs::write(ENABLE_URING, "Y")
            .with_context(|| format!("writing Y to {ENABLE_URING}"))?;
        Ok(Self {
            old: old.trim().to_owned(),
        })
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(ENABLE_URING, &self.old) {
            eprintln!(
                "fuse_rtt: could not restore {ENABLE_URING} to {}: {e}",
                self.old
            );
        }
    }
}

/// A mount of ours: aborted and detached when dropped.
struct Mount {
    path: PathBuf,
    conn: Option<u32>,
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(conn) = self.conn {
            let _ = std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), "1");
        }
        if let Ok(c) = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2 with a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// The connection number of the FUSE mount at `path` (its anonymous device's minor), from
/// mountinfo: a stat of the mount would itself wait for the daemon.
fn connection_of(path: &Path) -> Result<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = path.to_str().context("mount path not UTF-8")?;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() > 4 && f[4] == want {
            let (major, minor) = f[2].split_once(':').context("bad mountinfo")?;
            if major == "0" {
                return Ok(minor.parse()?);
            }
        }
    }
    bail!("{want} not in mountinfo")
}

fn mount(path: &Path) -> Result<(OwnedFd, Mount)> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("/dev/fuse")?;
    let fd = OwnedFd::from(dev);
    let opts = format!("fd={},rootmode=40000,user_id=0,group_id=0", fd.as_raw_fd());
    let c = |s: &[u8]| std::ffi::CString::new(s).expect("no NUL");
    let (src, target, fstype, data) = (
        c(b"fuse_rtt"),
        c(path.as_os_str().as_encoded_bytes()),
        c(b"fuse.fuse_rtt"),
        c(opts.as_bytes()),
    );
    // SAFETY: mount(2) with valid NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("mount");
    }
    let mut guard = Mount {
        path: path.to_owned(),
        conn: None,
    };
    guard.conn = Some(connection_of(path)?);
    Ok((fd, guard))
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_ne_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The server: a fixed tree and a request counter.
struct Server {
    files: u64,
    uring: bool,
    requests: AtomicU64,
    /// Of those, how many came from a ring entry (the rest over /dev/fuse).
    ring_requests: AtomicU64,
}

/// What the handler wants sent back.
enum Reply {
    /// No reply (FORGET, INTERRUPT).
    None,
    /// `-errno`, or 0 with a body of this many bytes written to the out buffer.
    Sent { error: i32, len: usize },
}

impl Server {
    /// `fuse_attr` (88 bytes) of `ino` at `b[0..88]`.
    fn attr(&self, ino: u64, b: &mut [u8]) {
        b[..88].fill(0);
        put_u64(b, 0, ino);
        let (mode, nlink) = if ino == 1 {
            (0o040755, 2)
        } else {
            (0o100644, 1)
        };
        put_u32(b, 60, mode);
        put_u32(b, 64, nlink);
        put_u32(b, 80, 4096);
    }

    fn file_ino(&self, name: &[u8]) -> Option<u64> {
        let n: u64 = std::str::from_utf8(name.strip_prefix(b"f")?)
            .ok()?
            .parse()
            .ok()?;
        (n < self.files).then_some(n + 2)
    }

    /// Answers one request. `op_in` is the opcode's own header, `payload` what follows it
    /// (over /dev/fuse both are one slice: `op_in` holds everything after the in header).
    fn handle(&self, hdr: &[u8], op_in: &[u8], payload: &[u8], out: &mut [u8]) -> Reply {
        let opcode = get_u32(hdr, 4);
        let nodeid = get_u64(hdr, 16);
        if !matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT) {
            self.requests.fetch_add(1, Ordering::Relaxed);
        }
        let ok = |len| Reply::Sent { error: 0, len };
        let err = |e: i32| Reply::Sent { error: -e, len: 0 };
        match opcode {
            FUSE_INIT => {
                let flags = get_u32(op_in, 12);
                if flags & FUSE_INIT_EXT == 0 {
                    return err(libc::EPROTO);
                }
                out[..64].fill(0);
                put_u32(out, 0, 7);
                put_u32(out, 4, 45.min(get_u32(op_in, 4)));
                put_u32(out, 8, get_u32(op_in, 8));
                put_u32(out, 12, FUSE_INIT_EXT | FUSE_MAX_PAGES);
                put_u16(out, 16, 16);
                put_u16(out, 18, 12);
                put_u32(out, 20, MAX_WRITE);
                put_u32(out, 24, 1);
                put_u16(out, 28, MAX_PAGES);
                if self.uring {
                    put_u32(out, 32, FUSE_OVER_IO_URING_FLAGS2);
                }
                ok(64)
            }
            FUSE_LOOKUP => {
                // The name, NUL-terminated: over the ring in the payload (the op header of a
                // LOOKUP is empty), over /dev/fuse right after the in header.
                let name = if payload.is_empty() { op_in } else { payload };
                let name = name.split(|&c| c == 0).next().unwrap_or_default();
                let Some(ino) = (nodeid == 1).then(|| self.file_ino(name)).flatten() else {
                    return err(libc::ENOENT);
                };
                out[..40].fill(0);
                put_u64(out, 0, ino);
                self.attr(ino, &mut out[40..128]);
                ok(128)
            }
            FUSE_GETATTR => {
                out[..16].fill(0);
                self.attr(nodeid, &mut out[16..104]);
                ok(104)
            }
            FUSE_OPEN => {
                out[..16].fill(0);
                ok(16)
            }
            FUSE_FLUSH | FUSE_RELEASE | FUSE_DESTROY => ok(0),
            FUSE_STATFS => {
                out[..80].fill(0);
                put_u32(out, 40, 4096);
                put_u32(out, 44, 255);
                put_u32(out, 48, 4096);
                ok(80)
            }
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => Reply::None,
            _ => err(libc::ENOSYS),
        }
    }
}

/// Serves requests read from `/dev/fuse` until the connection ends. With `on_init`, runs it
/// right after the INIT reply was written (the ring is registered then).
fn dev_loop(fd: RawFd, server: Arc<Server>, on_init: Option<Box<dyn FnOnce() + Send>>) {
    let mut on_init = on_init;
    // SAFETY: `fd` stays open for the program's life (owned by main); ManuallyDrop keeps this
    // File from closing it.
    let mut dev = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let mut buf = vec![0u8; MAX_WRITE as usize + 4096 * 2];
    let mut out = vec![0u8; 4096];
    loop {
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::EINTR | libc::EAGAIN)
                ) =>
            {
                continue
            }
            Err(_) => return,
        };
        if n < IN_HEADER {
            continue;
        }
        let (hdr, rest) = buf[..n].split_at(IN_HEADER);
        let opcode = get_u32(hdr, 4);
        let unique = get_u64(hdr, 8);
        let reply = server.handle(hdr, rest, &[], &mut out[OUT_HEADER..]);
        if let Reply::Sent { error, len } = reply {
            put_u32(&mut out, 0, (OUT_HEADER + len) as u32);
            put_u32(&mut out, 4, error as u32);
            put_u64(&mut out, 8, unique);
            if dev.write_all(&out[..OUT_HEADER + len]).is_err() && opcode == FUSE_INIT {
                return;
            }
        }
        if opcode == FUSE_INIT {
            if let Some(f) = on_init.take() {
                f();
            }
        }
    }
}

/// A ring entry's two buffers and the iovec naming them (boxed: the kernel keeps the
/// addresses).
struct Entry {
    header: Box<[u8; RING_HEADER]>,
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

fn uring_cmd(
    fd: RawFd,
    op: u32,
    qid: u16,
    commit_id: u64,
    ent: &Entry,
    k: usize,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    put_u64(&mut cmd, 8, commit_id);
    put_u16(&mut cmd, 16, qid);
    let sqe = opcode::UringCmd80::new(types::Fd(fd), op)
        .cmd(cmd)
        .addr(Some(ent.iov.as_ptr() as u64))
        .build()
        .user_data(k as u64);
    // SAFETY: Entry128 is `#[repr(C)]` (`struct io_uring_sqe`, 64 bytes of command), 128 bytes of
    // plain data; `len` (the iovec count, which FUSE requires to be 2) is the u32 at offset 24
    // of `struct io_uring_sqe`, which the crate's UringCmd80 has no setter for.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    put_u32(&mut raw, 24, 2);
    // SAFETY: as above, back to the same type.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Registers `depth` entries on queue `qid` and serves their requests until the connection
/// ends.
fn ring_loop(fd: RawFd, qid: u16, depth: usize, t: &Transport, server: Arc<Server>) -> Result<()> {
    if t.pin {
        let mut set = rustix::thread::CpuSet::new();
        set.set(qid.into());
        rustix::thread::sched_setaffinity(None, &set)?;
    }
    let mut builder = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
    match t.setup {
        "none" => {}
        "coop" => {
            builder.setup_coop_taskrun();
        }
        "defer" => {
            builder.setup_single_issuer().setup_defer_taskrun();
        }
        o => bail!("unknown --ring-setup {o}"),
    }
    let mut ring = builder.build((depth * 2).next_power_of_two() as u32)?;
    let mut ents: Vec<Entry> = (0..depth)
        .map(|_| {
            let mut header = Box::new([0u8; RING_HEADER]);
            let mut payload = vec![0u8; RING_PAYLOAD];
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.as_mut_ptr().cast(),
                    iov_len: RING_HEADER,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: RING_PAYLOAD,
                },
            ]);
            Entry {
                header,
                payload,
                iov,
            }
        })
        .collect();
    for (k, ent) in ents.iter().enumerate() {
        let sqe = uring_cmd(fd, FUSE_IO_URING_CMD_REGISTER, qid, 0, ent, k);
        // SAFETY: the entry's buffers live as long as the ring (dropped after it returns).
        unsafe { ring.submission().push(&sqe) }.context("SQ full")?;
    }
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (k, res) in done {
            if res < 0 {
                let e = std::io::Error::from_raw_os_error(-res);
                // The connection ended (unmount, abort): the normal way out.
                if matches!(
                    -res,
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
                ) {
                    return Ok(());
                }
                bail!("queue {qid}: ring entry {k}: {e}");
            }
            let ent = &mut ents[k];
            let commit_id = get_u64(&ent.header[..], RING_ENT_COMMIT_ID);
            let payload_sz = get_u32(&ent.header[..], RING_ENT_PAYLOAD_SZ) as usize;
            let (hdr, op_in) = (
                &ent.header[..IN_HEADER],
                &ent.header[RING_OP_IN..2 * RING_OP_IN],
            );
            let hdr: [u8; IN_HEADER] = hdr.try_into().expect("40 bytes");
            let op_in: [u8; RING_OP_IN] = op_in.try_into().expect("128 bytes");
            let payload = ent.payload[..payload_sz.min(RING_PAYLOAD)].to_vec();
            server.ring_requests.fetch_add(1, Ordering::Relaxed);
            let reply = server.handle(&hdr, &op_in, &payload, &mut ent.payload);
            let (error, len) = match reply {
                Reply::Sent { error, len } => (error, len),
                Reply::None => (-libc::ENOSYS, 0),
            };
            put_u32(&mut ent.header[..], 0, (OUT_HEADER + len) as u32);
            put_u32(&mut ent.header[..], 4, error as u32);
            put_u64(&mut ent.header[..], 8, get_u64(&hdr, 8));
            put_u32(&mut ent.header[..], RING_ENT_PAYLOAD_SZ, len as u32);
            let sqe = uring_cmd(
                fd,
                FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                qid,
                commit_id,
                ent,
                k,
            );
            // SAFETY: as at registration.
            unsafe { ring.submission().push(&sqe) }.context("SQ full")?;
        }
    }
}

fn possible_cpus() -> Result<u16> {
    // "0-1", "0", "0-3,5"...: the kernel makes one queue per possible CPU (nr_cpu_ids).
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0u16;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().context("cpu list")?;
        max = max.max(last.parse()?);
    }
    Ok(max + 1)
}

/// Mounts at `path` and serves it with `transport` on background threads.
fn serve(path: &Path, transport: &Transport, args: &Args) -> Result<(Mount, Arc<Server>, OwnedFd)> {
    let server = Arc::new(Server {
        files: args.iters as u64,
        uring: transport.uring,
        requests: AtomicU64::new(0),
        ring_requests: AtomicU64::new(0),
    });
    let (fd, guard) = mount(path)?;
    let raw = fd.as_raw_fd();
    let on_init: Option<Box<dyn FnOnce() + Send>> = match transport.uring {
        false => None,
        true => {
            let queues = possible_cpus()?;
            let (server, t, depth) = (server.clone(), transport.clone(), args.depth);
            Some(Box::new(move || {
                for qid in 0..queues {
                    let (server, t) = (server.clone(), t.clone());
                    std::thread::spawn(move || {
                        if let Err(e) = ring_loop(raw, qid, depth, &t, server) {
                            eprintln!("fuse_rtt: io_uring queue {qid}: {e:#}");
                        }
                    });
                }
            }))
        }
    };
    {
        let server = server.clone();
        std::thread::spawn(move || dev_loop(raw, server, on_init));
    }
    if !transport.uring {
        for _ in 1..transport.threads {
            let clone = File::options().read(true).write(true).open("/dev/fuse")?;
            let mut src = raw as u32;
            // SAFETY: FUSE_DEV_IOC_CLONE takes a pointer to the source descriptor's number.
            if unsafe { libc::ioctl(clone.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut src) } != 0 {
                return Err(std::io::Error::last_os_error()).context("FUSE_DEV_IOC_CLONE");
            }
            let cfd = OwnedFd::from(clone);
            let server = server.clone();
            // The clone lives as long as its thread: leaked on purpose for the program's life.
            let cfd = std::mem::ManuallyDrop::new(cfd).as_raw_fd();
            std::thread::spawn(move || dev_loop(cfd, server, None));
        }
    }
    Ok((guard, server, fd))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One loop: (elapsed µs, requests the server counted).
fn ops(names: &[std::ffi::CString], work: &str) -> Result<()> {
    for name in names {
        match work {
            "open+close" => {
                // SAFETY: open/close with a valid path.
                let fd = unsafe { libc::open(name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if fd < 0 {
                    return Err(std::io::Error::last_os_error()).context("open");
                }
                // SAFETY: our descriptor.
                unsafe { libc::close(fd) };
            }
            _ => {
                // SAFETY: a zeroed struct stat filled by stat(2).
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: valid path and out pointer.
                if unsafe { libc::stat(name.as_ptr(), &mut st) } != 0 {
                    return Err(std::io::Error::last_os_error()).context("stat");
                }
            }
        }
    }
    Ok(())
}

/// One loop of `iters` operations split among `clients` threads: (elapsed µs, requests the
/// server counted).
fn run_loop(
    mnt: &Path,
    server: &Server,
    work: &str,
    iters: usize,
    clients: usize,
) -> Result<(f64, u64)> {
    let names: Vec<std::ffi::CString> = (0..iters)
        .map(|i| std::ffi::CString::new(mnt.join(format!("f{i}")).as_os_str().as_encoded_bytes()))
        .collect::<Result<_, _>>()?;
    let before = server.requests.load(Ordering::Relaxed);
    let t = Instant::now();
    if clients <= 1 {
        ops(&names, work)?;
    } else {
        std::thread::scope(|s| -> Result<()> {
            let handles: Vec<_> = names
                .chunks(iters.div_ceil(clients))
                .map(|chunk| s.spawn(move || ops(chunk, work)))
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
            }
            Ok(())
        })?;
    }
    let el = t.elapsed().as_secs_f64() * 1e6;
    // RELEASE is sent after close returns: let the last ones arrive before counting.
    let mut last = server.requests.load(Ordering::Relaxed);
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let now = server.requests.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    Ok((el, last - before))
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (mount(2), /dev/fuse, {ENABLE_URING})");
    }
    let mut transports = Vec::new();
    for t in args.transports.split(',') {
        transports.push(Transport::parse(t, args.dev_threads)?);
    }
    let _uring = if transports.iter().any(|t| t.uring) {
        Some(EnableUring::on()?)
    } else {
        None
    };
    let dir = tempfile::tempdir()?;
    let mut mounts = Vec::new();
    for (i, t) in transports.into_iter().enumerate() {
        let path = dir.path().join(format!("m{i}"));
        std::fs::create_dir(&path)?;
        let (guard, server, fd) = serve(&path, &t, &args)?;
        mounts.push((t, path, guard, server, fd));
    }
    // First contact (waits for INIT and, over io_uring, for every queue to be registered).
    for (t, path, ..) in &mounts {
        let st = nix::sys::statfs::statfs(path).with_context(|| format!("statfs {}", t.name))?;
        let _ = st;
    }
    let works = ["open+close", "stat"];
    // (transport, work) -> per round (µs per op, requests per op, µs per request)
    let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); mounts.len() * works.len()];
    for round in 0..args.rounds {
        for i in 0..mounts.len() {
            let m = (i + round) % mounts.len();
            let (_, path, _, server, _) = &mounts[m];
            for (w, work) in works.iter().enumerate() {
                let (us, reqs) = run_loop(path, server, work, args.iters, args.clients)?;
                let n = args.iters as f64;
                results[m * works.len() + w].push((
                    us / n,
                    reqs as f64 / n,
                    us / reqs.max(1) as f64,
                ));
            }
        }
    }
    println!(
        "fuse_rtt: {} rounds × {} ops, {} client(s), dev_threads={}, ring depth={} per queue, \
         {} queue(s); medians",
        args.rounds,
        args.iters,
        args.clients,
        args.dev_threads,
        args.depth,
        possible_cpus()?,
    );
    for (t, _, _, server, _) in &mounts {
        println!(
            "{}: {} requests, {} of them from ring entries",
            t.name,
            server.requests.load(Ordering::Relaxed),
            server.ring_requests.load(Ordering::Relaxed)
        );
    }
    println!(
        "{:<12} {:<18} {:>10} {:>12} {:>12} {:>14}",
        "work", "transport", "µs/op", "requests/op", "µs/request", "vs first"
    );
    for (w, work) in works.iter().enumerate() {
        for (m, (t, ..)) in mounts.iter().enumerate() {
            let r = &results[m * works.len() + w];
            let mut a: Vec<f64> = r.iter().map(|x| x.0).collect();
            let mut b: Vec<f64> = r.iter().map(|x| x.1).collect();
            let mut c: Vec<f64> = r.iter().map(|x| x.2).collect();
            // Per round, this transport's time over the first transport's (interleaved in the
            // same round), then the median of those ratios.
            let mut ratios: Vec<f64> = r
                .iter()
                .zip(&results[w])
                .map(|(x, first)| x.0 / first.0)
                .collect();
            println!(
                "{:<12} {:<18} {:>10.2} {:>12.2} {:>12.2} {:>14.3}",
                work,
                t.name,
                median(&mut a),
                median(&mut b),
                median(&mut c),
                median(&mut ratios)
            );
        }
    }
    std::io::stdout().flush()?;
    // Unmount (abort + detach) before the descriptors close, then put enable_uring back.
    for (_, _, guard, _, fd) in mounts.into_iter().rev() {
        drop(guard);
        drop(fd);
    }
    Ok(())
}
