//! The client modification log (CML): the mutations made while disconnected, kept in order on
//! disk until they are reintegrated (client/disconnected.rs; the format: docs/remote.md,
//! "The client modification log").
//!
//! A directory (mode 0700, the daemon's, writable by nobody else) holds:
//! - `log`: an 8-byte header (`DCCML`, two zero bytes, the format version) and then records,
//!   each `len` (u32 LE) `check` (u64 LE, FNV-1a 64 of the body) `body` (postcard of a
//!   [`Record`]), appended and fsync'ed one at a time (mode 0600). A short or corrupt record
//!   ends the log (a crash while appending: the record was never acknowledged);
//! - `d<seq>`: the data of a [`Op::Store`] record (0600, fsync'ed before its record);
//! - `done`: the sequence number of the last record reintegrated (written to a temporary
//!   file, fsync'ed, renamed), so a reintegration cut short resumes after it;
//! - `replay`: the replay journal, one line per record whose replay was begun (appended and
//!   fsync'ed before the record is sent to the server: `SEQ -`, or `SEQ TARGET-IN-HEX` for a
//!   [`Op::Store`], the name its data goes to, decided once). A record begun but not `done`
//!   may have been applied already (the client was killed between the two): it is replayed
//!   again as "maybe applied" (client/disconnected.rs, `Disconnected::reintegrate`).
//!
//! When every record is reintegrated the log is truncated to its header and the data files
//! are removed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use dircache_core::{Attr, RenameMode, SetAttr, Timespec};
use serde::{Deserialize, Serialize};

use crate::proto::WireCred;

/// The header: magic and format version (the last byte).
pub const HEADER: [u8; 8] = *b"DCCML\0\0\x01";

/// The largest record body accepted when reading (a longer length is corruption).
const MAX_RECORD: usize = 1 << 20;

/// One mutation, with the credentials of the caller who made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub cred: WireCred,
    pub op: Op,
}

/// A mutation made while disconnected (paths relative to the mount's root on the server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Mkdir {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        mode: u32,
        umask: u32,
    },
    Symlink {
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
    },
    Unlink {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
    },
    Rmdir {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
    },
    Rename {
        #[serde(with = "serde_bytes")]
        old: Vec<u8>,
        #[serde(with = "serde_bytes")]
        new: Vec<u8>,
        mode: RenameMode,
    },
    /// chmod, chown, utimes (times as set, never "now").
    Setattr {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        set: SetAttr,
    },
    /// A file's whole contents as closed (data file `d<seq>`), created with `mode` and
    /// `umask` if missing; `base`: the server's attributes of the version it was changed
    /// from (`None`: created while disconnected), for conflict detection.
    Store {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        mode: u32,
        umask: u32,
        size: u64,
        mtime: Timespec,
        base: Option<Attr>,
    },
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A record as it is written in the log.
pub fn frame(r: &Record) -> std::io::Result<Vec<u8>> {
    let body = postcard::to_stdvec(r).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&fnv1a(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The records of a log's bytes (after the header), up to the first short or corrupt one.
pub fn parse(mut b: &[u8]) -> (Vec<Record>, bool) {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 12 {
            return (out, false);
        }
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let mut ck = [0u8; 8];
        ck.copy_from_slice(&b[4..12]);
        if len > MAX_RECORD || b.len() < 12 + len {
            return (out, false);
        }
        let body = &b[12..12 + len];
        if fnv1a(body) != u64::from_le_bytes(ck) {
            return (out, false);
        }
        match postcard::from_bytes::<Record>(body) {
            Ok(r) => out.push(r),
            Err(_) => return (out, false),
        }
        b = &b[12 + len..];
    }
    (out, true)
}

/// A client modification log in its directory (module docs).
pub struct Log {
    dir: PathBuf,
    file: File,
    /// Records not reintegrated yet, in order.
    pending: Vec<Record>,
    /// Records reintegrated (by this run or an earlier one), in order.
    applied: Vec<Record>,
    /// The replay journal: records begun, with the target of a `Store`.
    begun: std::collections::HashMap<u64, Option<Vec<u8>>>,
    next_seq: u64,
    /// Conflicts found by reintegrations (for statistics).
    pub conflicts: u64,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.dir)
            .field("pending", &self.pending.len())
            .finish()
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Log {
    /// Open (or make) the log in `dir`, keeping the records a previous run left
    /// unreintegrated.
    pub fn open(dir: &Path) -> std::io::Result<Log> {
        use std::os::unix::fs::MetadataExt;
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let md = std::fs::symlink_metadata(dir)?;
        super::container::check_ancestors(dir)?;
        let me = rustix::process::geteuid().as_raw();
        if !md.is_dir() || md.uid() != me || md.mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{}: a modification log directory must be uid {me}'s, mode 0700",
                    dir.display()
                ),
            ));
        }
        let path = dir.join("log");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        // One mount at a time per log.
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |e| {
                std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!("{}: in use by another mount ({e})", path.display()),
                )
            },
        )?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut pending = Vec::new();
        let mut applied = Vec::new();
        if bytes.len() < HEADER.len() {
            file.set_len(0)?;
            file.write_all(&HEADER)?;
            file.sync_all()?;
            sync_dir(dir)?;
        } else if bytes[..HEADER.len()] != HEADER {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: not a dircache modification log of version {}",
                    path.display(),
                    HEADER[7]
                ),
            ));
        } else {
            let (recs, whole) = parse(&bytes[HEADER.len()..]);
            if !whole {
                tracing::warn!(
                    "{}: a short or corrupt record after {} records (ignored: it was never \
                     acknowledged)",
                    path.display(),
                    recs.len()
                );
            }
            let done = std::fs::read_to_string(dir.join("done"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            (applied, pending) = recs.into_iter().partition(|r| r.seq <= done);
            if !pending.is_empty() {
                tracing::warn!(
                    "{}: {} mutations not reintegrated yet",
                    path.display(),
                    pending.len()
                );
            }
        }
        let next_seq = pending.last().map_or(1, |r| r.seq + 1).max(
            std::fs::read_to_string(dir.join("done"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0)
                + 1,
        );
        let begun = if pending.is_empty() && applied.is_empty() {
            Default::default()
        } else {
            read_journal(&dir.join("replay"))
        };
        Ok(Log {
            dir: dir.to_path_buf(),
            file,
            pending,
            applied,
            begun,
            next_seq,
            conflicts: 0,
        })
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sequence number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The data file of record `seq`.
    pub fn data_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("d{seq}"))
    }

    /// Copy `size` bytes of `from` into the data file of the next record (fsync'ed).
    pub fn save_data(&self, from: &File, size: u64) -> std::io::Result<()> {
        let p = self.data_path(self.next_seq);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        while off < size {
            let want = ((size - off) as usize).min(buf.len());
            let n = std::os::unix::fs::FileExt::read_at(from, &mut buf[..want], off)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
            off += n as u64;
        }
        out.sync_all()?;
        Ok(())
    }

    /// Append `op` by `cred` (fsync'ed before this returns); its sequence number.
    pub fn append(&mut self, cred: WireCred, op: Op) -> std::io::Result<u64> {
        let r = Record {
            seq: self.next_seq,
            cred,
            op,
        };
        let f = frame(&r)?;
        self.file.write_all(&f)?;
        self.file.sync_data()?;
        self.next_seq += 1;
        tracing::debug!("logged #{}: {:?}", r.seq, r.op);
        self.pending.push(r);
        Ok(self.next_seq - 1)
    }

    /// A conflict found reintegrating `path`: the local version went to `kept` (a line in
    /// the `conflicts` file: time, path, where the local version is, why; tab-separated).
    pub fn note_conflict(&mut self, path: &[u8], kept: &[u8], why: &str) {
        self.conflicts += 1;
        let line = format!(
            "{}\t{}\t{}\t{why}\n",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            String::from_utf8_lossy(path),
            String::from_utf8_lossy(kept)
        );
        let r = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(self.dir.join("conflicts"))
            .and_then(|mut f| {
                f.write_all(line.as_bytes())?;
                f.sync_data()
            });
        if let Err(e) = r {
            tracing::error!("recording a conflict in {}: {e}", self.dir.display());
        }
    }

    /// The conflicts recorded in the log directory `dir` (lines of its `conflicts` file).
    pub fn conflicts_in(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("conflicts"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Records not reintegrated yet, in order.
    pub fn pending(&self) -> &[Record] {
        &self.pending
    }

    /// Records reintegrated so far (by this run or an earlier one), in order.
    pub fn applied(&self) -> &[Record] {
        &self.applied
    }

    /// Whether the replay of record `seq` was begun (by this run or an earlier one), and
    /// the target then decided for a `Store` (`Some(None)`: begun, no target recorded).
    pub fn begun(&self, seq: u64) -> Option<Option<&[u8]>> {
        self.begun.get(&seq).map(|t| t.as_deref())
    }

    /// The replay of record `seq` begins (with the target of a `Store`): appended to the
    /// replay journal and fsync'ed before this returns, so that a later run knows the
    /// record may have been applied.
    pub fn begin(&mut self, seq: u64, target: Option<&[u8]>) -> std::io::Result<()> {
        let line = match target {
            Some(t) => format!("{seq} {}\n", hex(t)),
            None => format!("{seq} -\n"),
        };
        let p = self.dir.join("replay");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)?;
        f.write_all(line.as_bytes())?;
        f.sync_data()?;
        self.begun.insert(seq, target.map(<[u8]>::to_vec));
        Ok(())
    }

    /// Record `seq` (the first pending) is reintegrated: remembered on disk before it is
    /// dropped, so it is never applied twice by a later run.
    pub fn done(&mut self, seq: u64) -> std::io::Result<()> {
        let tmp = self.dir.join("done.tmp");
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            writeln!(f, "{seq}")?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join("done"))?;
        sync_dir(&self.dir)?;
        let _ = std::fs::remove_file(self.data_path(seq));
        let (now, rest) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|r| r.seq <= seq);
        self.pending = rest;
        self.applied.extend::<Vec<Record>>(now);
        Ok(())
    }

    /// Everything is reintegrated: remove the log's files (the directory and its `conflicts`
    /// stay); the next log starts again at sequence number 1.
    pub fn remove_files(&self) {
        // The journal first: what is left of a removal cut short never names records of
        // the next log.
        for f in ["replay", "log", "done"] {
            if let Err(e) = std::fs::remove_file(self.dir.join(f)) {
                tracing::warn!("removing {}: {e}", self.dir.join(f).display());
            }
        }
        let _ = sync_dir(&self.dir);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|c| format!("{c:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The replay journal's lines (module docs); a torn last line is ignored (its record was not
/// sent yet).
fn read_journal(p: &Path) -> std::collections::HashMap<u64, Option<Vec<u8>>> {
    let text = std::fs::read(p).unwrap_or_default();
    let mut out = std::collections::HashMap::new();
    let mut lines: Vec<&[u8]> = text.split(|&c| c == b'\n').collect();
    // After the last newline: empty, or a line cut short.
    lines.pop();
    for line in lines {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let mut w = line.split(' ');
        let (Some(seq), Some(t), None) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let Ok(seq) = seq.parse::<u64>() else {
            continue;
        };
        let target = if t == "-" {
            None
        } else {
            match unhex(t) {
                Some(t) => Some(t),
                None => continue,
            }
        };
        out.insert(seq, target);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> Record {
        Record {
            seq,
            cred: WireCred {
                uid: 1,
                gid: 2,
                groups: vec![3],
            },
            op: Op::Mkdir {
                path: b"a/b".to_vec(),
                mode: 0o755,
                umask: 0o22,
            },
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_dropped() {
        let mut b = frame(&rec(1)).unwrap();
        b.extend(frame(&rec(2)).unwrap());
        assert_eq!(parse(&b), (vec![rec(1), rec(2)], true));
        let cut = &b[..b.len() - 3];
        assert_eq!(parse(cut), (vec![rec(1)], false));
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        assert_eq!(parse(&bad), (vec![rec(1)], false));
    }

    #[test]
    fn the_replay_journal_survives_a_reopen_and_a_torn_line_is_ignored() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("cml");
        let mut l = Log::open(&dir).unwrap();
        let r = rec(0);
        for _ in 0..3 {
            l.append(r.cred.clone(), r.op.clone()).unwrap();
        }
        l.begin(1, None).unwrap();
        l.done(1).unwrap();
        l.begin(2, Some(b"a/b.dircache-conflict-1")).unwrap();
        drop(l);
        // A line cut short by a crash: never acted on.
        let mut j = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("replay"))
            .unwrap();
        j.write_all(b"3 61").unwrap();
        drop(j);
        let l = Log::open(&dir).unwrap();
        assert_eq!(l.applied().iter().map(|r| r.seq).collect::<Vec<_>>(), [1]);
        assert_eq!(
            l.pending().iter().map(|r| r.seq).collect::<Vec<_>>(),
            [2, 3]
        );
        assert_eq!(l.begun(1), Some(None));
        assert_eq!(l.begun(2), Some(Some(&b"a/b.dircache-conflict-1"[..])));
        assert_eq!(l.begun(3), None);
        l.remove_files();
        assert!(!dir.join("replay").exists());
    }

    #[test]
    fn a_log_keeps_what_is_not_done_across_opens() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("cml");
        let mut l = Log::open(&dir).unwrap();
        let r = rec(0);
        l.append(r.cred.clone(), r.op.clone()).unwrap();
        l.append(r.cred.clone(), r.op.clone()).unwrap();
        l.done(1).unwrap();
        drop(l);
        let mut l = Log::open(&dir).unwrap();
        assert_eq!(l.pending().iter().map(|r| r.seq).collect::<Vec<_>>(), [2]);
        assert_eq!(l.next_seq(), 3);
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(dir.join("log")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        // A second mount of the same tree is refused the log while this one holds it.
        assert!(Log::open(&dir).is_err());
        l.done(2).unwrap();
        l.remove_files();
        drop(l);
        assert!(!dir.join("log").exists());
        let l = Log::open(&dir).unwrap();
        assert!(l.pending().is_empty());
        assert_eq!(l.next_seq(), 1);
    }
}
