//! Differential test: the in-memory backend (dircache_core::memory) against the kernel, through
//! LocalBackend, on random operations under three credentials. Every result (errno) and the
//! whole tree afterwards (names, types, modes, owners, link counts, sizes, link targets) must be
//! equal. Seed: DIRCACHE_SEED=<n> to replay; printed on failure.
//!
//! Runs in its own test binary because it sets the process umask to 0 (MemoryBackend applies
//! no umask; the kernel applies the process's).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use dircache_core::memory::MemoryBackend;
use dircache_core::{Backend, Cred, FileType, RenameMode, SetAttr, TimeSet, Timespec};
use dircache_local::{LocalBackend, WatchMode};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

fn creds() -> Vec<Cred> {
    vec![
        Cred::root(),
        Cred::new(1000, 1000, [2000]),
        Cred::new(1001, 2000, []),
    ]
}

/// Paths known to exist (from the last snapshot) and the directories among them.
#[derive(Default)]
struct Known {
    paths: Vec<Vec<u8>>,
    dirs: Vec<Vec<u8>>,
}

fn fully_random(rng: &mut Rng) -> Vec<u8> {
    let depth = 1 + rng.below(3);
    let mut p = Vec::new();
    for i in 0..depth {
        if i > 0 {
            p.push(b'/');
        }
        p.push(*rng.pick(b"abc"));
    }
    p
}

/// Mostly paths that exist or could be created, so that operations often succeed.
fn random_path(rng: &mut Rng, k: &Known) -> Vec<u8> {
    match rng.below(10) {
        0..=3 if !k.paths.is_empty() => rng.pick(&k.paths).clone(),
        4..=7 => {
            let mut p = if k.dirs.is_empty() || rng.below(4) == 0 {
                Vec::new()
            } else {
                rng.pick(&k.dirs).clone()
            };
            if p.iter().filter(|&&c| c == b'/').count() >= 3 {
                p.clear();
            }
            if !p.is_empty() {
                p.push(b'/');
            }
            p.push(*rng.pick(b"abcd"));
            p
        }
        _ => fully_random(rng),
    }
}

const MODES: &[u32] = &[
    0o777, 0o777, 0o1777, 0o775, 0o755, 0o755, 0o700, 0o777, 0o1777, 0o2775, 0o644, 0o600, 0o4755,
    0o2755, 0o070, 0o007, 0o000, 0o750, 0o3777,
];

#[derive(Clone)]
enum Op {
    Mkdir(Vec<u8>, u32),
    Mknod(Vec<u8>, u32),
    Symlink(Vec<u8>, Vec<u8>),
    Link(Vec<u8>, Vec<u8>),
    Unlink(Vec<u8>),
    Rmdir(Vec<u8>),
    Rename(Vec<u8>, Vec<u8>, RenameMode),
    Setattr(Vec<u8>, SetAttr),
    /// open(2) with flags and mode, then a write of this many bytes when the access mode
    /// writes (O_NONBLOCK always: a fifo must not block).
    Open(Vec<u8>, i32, u32, usize),
    /// Queries (no credentials): getattr, readlink, readdir.
    Query(Vec<u8>),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |p: &Vec<u8>| String::from_utf8_lossy(p).into_owned();
        match self {
            Op::Mkdir(p, m) => write!(f, "mkdir {} {m:o}", s(p)),
            Op::Mknod(p, m) => write!(f, "mknod {} {m:o}", s(p)),
            Op::Symlink(t, p) => write!(f, "symlink {} -> {}", s(p), s(t)),
            Op::Link(o, n) => write!(f, "link {} {}", s(o), s(n)),
            Op::Unlink(p) => write!(f, "unlink {}", s(p)),
            Op::Rmdir(p) => write!(f, "rmdir {}", s(p)),
            Op::Rename(o, n, m) => write!(f, "rename {} {} {m:?}", s(o), s(n)),
            Op::Setattr(p, a) => write!(f, "setattr {} {a:?}", s(p)),
            Op::Open(p, fl, m, n) => write!(f, "open {} flags={fl:o} mode={m:o} write={n}", s(p)),
            Op::Query(p) => write!(f, "query {}", s(p)),
        }
    }
}

/// Open flags the differential test tries (with O_NONBLOCK).
const OPEN_FLAGS: &[i32] = &[
    libc::O_RDONLY,
    libc::O_WRONLY,
    libc::O_RDWR,
    libc::O_WRONLY | libc::O_CREAT,
    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
    libc::O_WRONLY | libc::O_TRUNC,
    libc::O_RDONLY | libc::O_TRUNC,
    libc::O_WRONLY | libc::O_APPEND,
    libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
    libc::O_RDONLY | libc::O_NOATIME,
    libc::O_RDONLY | libc::O_DIRECTORY,
];

fn random_op(rng: &mut Rng, k: &Known, opens: bool) -> Op {
    let p = random_path(rng, k);
    if opens && rng.below(5) == 0 {
        return Op::Open(
            p,
            *rng.pick(OPEN_FLAGS),
            *rng.pick(&[0o644, 0o600, 0o444, 0o4755, 0o2775]),
            *rng.pick(&[1, 100, 5000]),
        );
    }
    match rng.below(15) {
        12 => Op::Query(p),
        13 | 14 => Op::Link(p, random_path(rng, k)),
        0 | 1 => Op::Mkdir(p, *rng.pick(MODES)),
        2 | 9 => Op::Mknod(
            p,
            *rng.pick(&[
                libc::S_IFREG | 0o644,
                libc::S_IFREG | 0o2755,
                libc::S_IFIFO | 0o600,
                libc::S_IFREG | 0o777,
            ]),
        ),
        3 => Op::Symlink(random_path(rng, k), p),
        4 => Op::Link(p, random_path(rng, k)),
        5 => Op::Unlink(p),
        6 => Op::Rmdir(p),
        7 | 8 | 10 => Op::Rename(
            p,
            random_path(rng, k),
            *rng.pick(&[
                RenameMode::Replace,
                RenameMode::NoReplace,
                RenameMode::Exchange,
            ]),
        ),
        _ => {
            let mut s = SetAttr::default();
            match rng.below(6) {
                0 | 1 => s.mode = Some(*rng.pick(MODES)),
                2 => s.uid = Some(*rng.pick(&[0, 1000, 1001])),
                3 => s.gid = Some(*rng.pick(&[0, 1000, 2000])),
                4 => s.size = Some(*rng.pick(&[0, 10, 5000])),
                _ => {
                    let t = TimeSet::At(Timespec {
                        sec: 1_000_000 + rng.below(1000) as i64,
                        nsec: 0,
                    });
                    s.mtime = Some(*rng.pick(&[TimeSet::Now, t]));
                    s.atime = *rng.pick(&[None, Some(TimeSet::Now), Some(t)]);
                }
            }
            Op::Setattr(p, s)
        }
    }
}

fn apply(b: &dyn Backend, c: &Cred, op: &Op) -> i64 {
    let r = match op {
        Op::Mkdir(p, m) => b.mkdir(c, p, *m).map(drop),
        Op::Mknod(p, m) => b.mknod(c, p, *m, 0).map(drop),
        Op::Symlink(t, p) => b.symlink(c, t, p).map(drop),
        Op::Link(o, n) => b.link(c, o, n).map(drop),
        Op::Unlink(p) => b.unlink(c, p),
        Op::Rmdir(p) => b.rmdir(c, p),
        Op::Rename(o, n, m) => b.rename(c, o, n, *m),
        Op::Setattr(p, s) => b.setattr(c, p, s).map(drop),
        Op::Open(p, fl, m, n) => {
            // The memory backend has no data for directories, fifos, sockets and devices:
            // both sides skip those (the trees are equal, so both see the same type).
            if let Ok(a) = b.getattr(p) {
                if !matches!(a.kind(), FileType::Regular | FileType::Symlink) {
                    return -1;
                }
            }
            // (A mode without O_CREAT is EINVAL for openat2, which the local backend uses.)
            let m = if fl & libc::O_CREAT != 0 { *m } else { 0 };
            b.open(c, p, fl | libc::O_NONBLOCK, m).and_then(|f| {
                if fl & libc::O_ACCMODE != libc::O_RDONLY {
                    // As the caller, at offset 0 (at the end with O_APPEND), as a write(2)
                    // right after the open: set-id bits go as for that caller.
                    let data = vec![b'x'; *n];
                    let w = f.write_at(c, &data, 0, fl & libc::O_APPEND != 0)?;
                    assert_eq!(w, *n);
                }
                Ok(())
            })
        }
        Op::Query(p) => {
            let e = |r: dircache_core::Result<()>| r.err().map_or(0, |e| i64::from(e.errno()));
            let (d, n) = match p.iter().rposition(|&x| x == b'/') {
                Some(i) => (&p[..i], &p[i + 1..]),
                None => (&b""[..], &p[..]),
            };
            // Encode the three answers in one number.
            let g = e(b.getattr(p).map(drop));
            let l = e(b.lookup(d, n).map(drop));
            let r = e(b.readlink(p).map(drop));
            let ls = e(b.readdir(p, false).map(drop));
            // walk from the root over every component, and from the first one
            let comps: Vec<&[u8]> = p.split(|&x| x == b'/').collect();
            let w1 = b.walk(b"", &comps);
            let w2 = b.walk(comps[0], &comps[1..]);
            let w = |w: dircache_core::Walked| {
                (w.attrs.len() as i64) * 1000 + w.error.map_or(0, |e| i64::from(e.errno()))
            };
            let walks = w(w1) * 100_000 + w(w2);
            return ((g * 100 + l) * 100 + r) * 100 + ls + walks * 100_000_000;
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => i64::from(e.errno()),
    }
}

/// The tree as comparable lines.
fn snapshot(b: &dyn Backend) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        let mut ents = b.readdir(&dir, true).unwrap();
        ents.sort_by(|x, y| x.name.cmp(&y.name));
        for e in ents {
            let mut p = dir.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&e.name);
            let a = e.attr.unwrap();
            let size = match a.kind() {
                FileType::Directory => 0, // file-system specific
                _ => a.size,
            };
            let target = if a.kind() == FileType::Symlink {
                String::from_utf8_lossy(&b.readlink(&p).unwrap()).into_owned()
            } else {
                String::new()
            };
            out.push(format!(
                "{} mode={:o} uid={} gid={} nlink={} size={} {}",
                String::from_utf8_lossy(&p),
                a.mode,
                a.uid,
                a.gid,
                a.nlink,
                size,
                target
            ));
            if a.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

type Times = std::collections::BTreeMap<Vec<u8>, (u64, Timespec, Timespec)>;

/// mtime and ctime of every path (root included).
fn times(b: &dyn Backend) -> Times {
    let mut out = Times::new();
    let r = b.getattr(b"").unwrap();
    out.insert(Vec::new(), (r.ino, r.mtime, r.ctime));
    let mut stack = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        for e in b.readdir(&dir, true).unwrap() {
            let mut p = dir.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&e.name);
            let a = e.attr.unwrap();
            out.insert(p.clone(), (a.ino, a.mtime, a.ctime));
            if a.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// Wait until the kernel's coarse clock (the one file timestamps come from) ticks.
fn next_tick() {
    use rustix::time::{clock_gettime, ClockId};
    let t0 = clock_gettime(ClockId::RealtimeCoarse);
    while clock_gettime(ClockId::RealtimeCoarse) == t0 {
        std::hint::spin_loop();
    }
}

/// Which paths (present before and after) now name another inode, and which kept their inode
/// but had its mtime / ctime changed. (Timestamps of different inodes are not compared: the
/// kernel's coarse clock gives files made in the same tick equal times.)
fn changed(before: &Times, after: &Times) -> Vec<String> {
    let mut v = Vec::new();
    for (p, (i0, m0, c0)) in before {
        if let Some((i1, m1, c1)) = after.get(p) {
            let p = String::from_utf8_lossy(p);
            if i0 != i1 {
                v.push(format!("{p}:replaced"));
                continue;
            }
            if m0 != m1 {
                v.push(format!("{p}:mtime"));
            }
            if c0 != c1 {
                v.push(format!("{p}:ctime"));
            }
        }
    }
    v
}

/// The content of every regular file, read as root.
fn contents(b: &dyn Backend) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        for e in b.readdir(&dir, false).unwrap() {
            let mut p = dir.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&e.name);
            match e.kind {
                FileType::Directory => stack.push(p),
                FileType::Regular => {
                    let f = b.open(&Cred::root(), &p, libc::O_RDONLY, 0).unwrap();
                    let mut data = vec![0u8; 20_000];
                    let n = f.read_at(&mut data, 0).unwrap();
                    data.truncate(n);
                    out.push((p, data));
                }
                _ => {}
            }
        }
    }
    out.sort();
    out
}

fn run(seed: u64, steps: usize) {
    let t = common::tmp();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let local = LocalBackend::with_options(t.path(), 64, WatchMode::Off).unwrap();
    let mem = MemoryBackend::new();
    let root = Cred::root();
    mem.setattr(
        &root,
        b"",
        &SetAttr {
            mode: Some(0o777),
            ..Default::default()
        },
    )
    .unwrap();
    let creds = creds();
    let mut rng = Rng(seed | 1);
    // The memory backend models fs.protected_regular = 0 (O_CREAT of another user's file in a
    // sticky directory is allowed).
    let opens = fs::read_to_string("/proc/sys/fs/protected_regular")
        .map(|s| s.trim() == "0")
        .unwrap_or(false);
    if !opens {
        eprintln!("fs.protected_regular is not 0: no open operations");
    }
    let mut history = Vec::new();
    let mut ms = snapshot(&mem);
    assert_eq!(ms, snapshot(&local));
    let (mut kt, mut mt) = (times(&local), times(&mem));
    for step in 0..steps {
        let known = Known {
            paths: ms
                .iter()
                .map(|l| l.split(' ').next().unwrap_or("").as_bytes().to_vec())
                .collect(),
            dirs: ms
                .iter()
                .filter(|l| l.contains(" mode=40"))
                .map(|l| l.split(' ').next().unwrap_or("").as_bytes().to_vec())
                .collect(),
        };
        let op = random_op(&mut rng, &known, opens);
        // The kernel stamps changes with its coarse clock and leaves a time that already
        // equals "now" alone (a write right after a chmod in the same tick moves only the
        // mtime); the memory backend's clock always moves. Start each step in a new tick.
        next_tick();
        // root half of the time, so that the tree keeps changing
        let c = if rng.below(2) == 0 {
            creds[0].clone()
        } else {
            rng.pick(&creds).clone()
        };
        let k = apply(&local, &c, &op);
        let m = apply(&mem, &c, &op);
        history.push(format!(
            "{step}: uid {} {:?} -> kernel {k} memory {m}",
            c.uid, op
        ));
        let show = |h: &[String]| h[h.len().saturating_sub(15)..].join("\n");
        assert_eq!(
            m,
            k,
            "seed {seed} step {step}: errno differs\n{}\ntree before:\n{}",
            show(&history),
            ms.join("\n")
        );
        let ks = snapshot(&local);
        ms = snapshot(&mem);
        assert_eq!(
            ms,
            ks,
            "seed {seed} step {step}: trees differ\n{}",
            show(&history)
        );
        let (kt1, mt1) = (times(&local), times(&mem));
        let (kc, mc) = (changed(&kt, &kt1), changed(&mt, &mt1));
        assert_eq!(
            mc,
            kc,
            "seed {seed} step {step}: different timestamps changed\n{}",
            show(&history)
        );
        (kt, mt) = (kt1, mt1);
        if matches!(op, Op::Open(..) | Op::Setattr(..)) && m == 0 {
            assert!(
                contents(&mem) == contents(&local),
                "seed {seed} step {step}: file contents differ\n{}",
                show(&history)
            );
            // (Reading moves no mtime or ctime: the next step's comparison would see it.)
        }
    }
    // Coverage: how many operations of each kind succeeded.
    let mut ok: std::collections::BTreeMap<String, usize> = Default::default();
    for h in &history {
        if h.ends_with("kernel 0 memory 0") {
            let kind = h.split_whitespace().nth(3).unwrap_or("?").to_string();
            *ok.entry(kind).or_default() += 1;
        }
    }
    eprintln!("seed {seed}: {steps} steps, successes {ok:?}");
}

#[test]
fn memory_backend_agrees_with_kernel() {
    if !common::need_root("switches credentials") {
        return;
    }
    // SAFETY: umask has no preconditions; this test binary has no other test that cares.
    unsafe { libc::umask(0) };
    if fs::read_to_string("/proc/sys/fs/protected_hardlinks")
        .map(|s| s.trim() != "1")
        .unwrap_or(true)
    {
        eprintln!("protected_hardlinks is not 1; the memory backend models 1");
        return;
    }
    let seeds: Vec<u64> = match std::env::var("DIRCACHE_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            vec![1, t.as_nanos() as u64]
        }
    };
    for s in seeds {
        run(s, 1000);
    }
}
