//! The remote protocol's messages (docs/protocol.md is the specification).
//!
//! Every message is one [frame](crate::frame) whose payload is a postcard encoding of
//! [`ClientMsg`] (client to server) or [`ServerMsg`] (server to client). The first message each
//! way is a [`Hello`]; then the client sends [`ClientMsg::Call`]s, each with an id of its
//! choosing that no call in flight uses, and the server answers each with one or more
//! [`ServerMsg::Reply`] frames carrying the same id (the last has `last: true`; only streamed
//! replies, such as a huge directory's listing, use more than one), in any order relative to
//! other calls. [`ServerMsg::Callback`]s (invalidations) come in between at any time.

use dircache_core::{Attr, Change, Cred, DirEntry, RenameMode, SetAttr, StatFs};
use serde::{Deserialize, Serialize};

use crate::frame::FrameError;

/// The protocol version this build speaks. Both sides must speak the same one (2: attributes
/// carry [`Attr::birth`]; 3: so does a [`Target`]).
pub const VERSION: u32 = 3;
/// Magic bytes opening every [`Hello`]: tells a dircache peer from anything else on the stream
/// (a shell's greeting printed by a login script, say).
pub const MAGIC: [u8; 8] = *b"dircache";

/// Feature bits of a [`Hello`].
pub mod features {
    /// The server pushes [`Callback`](super::ServerMsg::Callback)s for changes made behind
    /// the client's back.
    pub const CALLBACKS: u64 = 1 << 0;
    /// [`Request::Subtree`](super::Request::Subtree) (bulk subtree metadata).
    pub const SUBTREE: u64 = 1 << 1;
    /// Extended attributes.
    pub const XATTRS: u64 = 1 << 2;
    /// [`Request::Search`] (delegated search) and [`Request::Cancel`].
    pub const SEARCH: u64 = 1 << 3;
    /// [`ClientMsg::Hurry`](super::ClientMsg::Hurry): a client waiting for one directory of
    /// a `Subtree` call in flight moves it ahead of the call's queue.
    pub const HURRY: u64 = 1 << 4;
    /// [`Request::OpenPlus`](super::Request::OpenPlus): an open answered with the file's
    /// attributes and its first bytes (one round trip for a cold open+read of a small file).
    pub const OPEN_PLUS: u64 = 1 << 5;
    /// Names first: a `Subtree` reply sends each directory's names and types (getdents; the
    /// subdirectories with their attributes) in [`Reply::Names`](super::Reply::Names) frames
    /// as soon as they are read, and its full listing (every entry's attributes) later, so a
    /// walk that needs names only (`find -name`) is answered before the server has statted
    /// every entry. Needs [`SUBTREE`].
    pub const NAMES: u64 = 1 << 6;
    /// A reply to a call that adds or removes a name (a create, `mkdir`, `unlink`, `rename`,
    /// an open with `O_CREAT`...) comes as [`Reply::Parents`](super::Reply::Parents): with the
    /// attributes of the directories it changed, read after it, so the client does not ask
    /// for them (the kernel does after each create). Needs [`CALLBACKS`] to be used.
    pub const PARENTS: u64 = 1 << 7;
    /// [`Request::Store`](super::Request::Store): a file's new contents, size and times in
    /// one call (a store-back on close was a `Write` with `SetSize`, then a `FileSetattr`:
    /// two round trips).
    pub const STORE: u64 = 1 << 8;
    /// Everything this build knows.
    pub const ALL: u64 =
        CALLBACKS | SUBTREE | XATTRS | SEARCH | HURRY | OPEN_PLUS | NAMES | PARENTS | STORE;
}

/// Largest frame a client sends (a write's data chunk plus its header fits).
pub const MAX_CLIENT_FRAME: usize = 2 << 20;
/// Largest frame a server sends (a read's data, a part of a listing).
pub const MAX_SERVER_FRAME: usize = 4 << 20;
/// Largest data chunk of one read or write.
pub const MAX_IO: usize = 1 << 20;
/// Entries per frame of a streamed listing.
pub const ENTRIES_PER_FRAME: usize = 4096;

/// The first message each way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 8],
    pub version: u32,
    /// What the sender offers (client) or grants (server: the intersection).
    pub features: u64,
}

impl Hello {
    pub fn new(features: u64) -> Hello {
        Hello {
            magic: MAGIC,
            version: VERSION,
            features,
        }
    }

    /// Whether `self` (the peer's hello) can be talked to; the reason otherwise.
    pub fn check(&self) -> Result<(), ProtoError> {
        if self.magic != MAGIC {
            return Err(ProtoError::NotDircache);
        }
        if self.version != VERSION {
            return Err(ProtoError::Version {
                ours: VERSION,
                theirs: self.version,
            });
        }
        Ok(())
    }
}

/// A caller's credentials on the wire ([`Cred`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireCred {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl From<&Cred> for WireCred {
    fn from(c: &Cred) -> WireCred {
        WireCred {
            uid: c.uid,
            gid: c.gid,
            groups: c.groups().to_vec(),
        }
    }
}

impl From<&WireCred> for Cred {
    fn from(c: &WireCred) -> Cred {
        Cred::new(c.uid, c.gid, c.groups.iter().copied())
    }
}

/// Client to server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMsg {
    Hello(Hello),
    Call {
        id: u64,
        cred: WireCred,
        req: Request,
    },
    /// (With [`features::HURRY`].) A caller waits for directory `dir` (relative to the call's
    /// `path`) of `Subtree` call `call`, still in flight: the server reads it (or the nearest
    /// ancestor it has not read yet, then the path down to it) before the rest of the call's
    /// queue, and what lies below it depth first. No reply; nothing if the call is over or
    /// `dir` was sent already. With [`features::NAMES`]: for a directory whose names were
    /// sent already, the caller waits for its attributes: its full listing (and those of
    /// the directories below it) is read before the other full listings.
    Hurry {
        call: u64,
        #[serde(with = "serde_bytes")]
        dir: Vec<u8>,
    },
}

/// A file a call is about, as [`dircache_core::XattrTarget`] without the descriptor: the path
/// and, when the caller holds a particular inode, its `(dev, ino)` (ESTALE if the path names
/// another one by now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    pub expect: Option<(u64, u64)>,
    /// That inode's [`Attr::birth`] (0: unknown): a file that reused the number is another.
    pub birth: u32,
}

/// Bytes that serialize as one byte string (not a sequence of numbers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bytes(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// The operations. Paths are backend paths (dircache_core::backend module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Walk {
        #[serde(with = "serde_bytes")]
        dir: Vec<u8>,
        names: Vec<Bytes>,
    },
    Lookup {
        #[serde(with = "serde_bytes")]
        dir: Vec<u8>,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Getattr {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
    },
    /// Streamed: [`Reply::Entries`] frames, the last with `last: true`.
    Readdir {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        plus: bool,
    },
    /// Streamed: [`Reply::Subtree`] frames: every entry below `path` (breadth first, with
    /// attributes), at most `budget` of them; the last frame says whether it was complete.
    Subtree {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        budget: u64,
    },
    Readlink {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
    },
    /// Creations carry the caller's `umask`: the server's file system applies it unless the
    /// parent directory has a default ACL (as for a local caller).
    Mknod {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        mode: u32,
        rdev: u64,
        umask: u32,
    },
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
    Link {
        #[serde(with = "serde_bytes")]
        old: Vec<u8>,
        #[serde(with = "serde_bytes")]
        new: Vec<u8>,
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
    Setattr {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        set: SetAttr,
    },
    Statfs {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
    },
    Getxattr {
        target: Target,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Listxattr {
        target: Target,
    },
    Setxattr {
        target: Target,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: i32,
    },
    Removexattr {
        target: Target,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Fsyncdir {
        target: Target,
        datasync: bool,
    },
    /// Answered with [`Reply::Opened`]: a handle for the calls below until [`Request::Close`].
    Open {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        flags: i32,
        mode: u32,
        umask: u32,
    },
    OpenVerified {
        target: Target,
        flags: i32,
    },
    Read {
        handle: u64,
        offset: u64,
        len: u32,
    },
    Write {
        handle: u64,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        append: bool,
    },
    Sync {
        handle: u64,
        datasync: bool,
    },
    Allocate {
        handle: u64,
        mode: i32,
        offset: u64,
        len: u64,
    },
    /// `whence` as lseek(2).
    Seek {
        handle: u64,
        offset: i64,
        whence: i32,
    },
    SetSize {
        handle: u64,
        size: u64,
    },
    FileSetattr {
        handle: u64,
        set: SetAttr,
    },
    FileAttr {
        handle: u64,
    },
    Close {
        handle: u64,
    },
    /// A delegated search (dircache_search): the server runs it over its root for the call's
    /// credentials. `paths` are backend paths (relative to the served root). Streamed:
    /// [`Reply::Found`] frames (an empty one at least every few seconds while it runs), the
    /// last with `last: true`; or one error.
    Search {
        paths: Vec<Bytes>,
        pattern: String,
        flags: u32,
    },
    /// Stop the search that call `call` started (its stream then ends with ECANCELED or
    /// whatever it had reached); answered with [`Reply::Unit`] at once.
    Cancel {
        call: u64,
    },
    /// Feature [`features::OPEN_PLUS`] (`read` first: the trace log of calls shows it): `how`
    /// as [`Request::Open`] or
    /// [`Request::OpenVerified`] would, answered with [`Reply::OpenedPlus`]: the handle, the
    /// opened file's attributes (what [`Request::FileAttr`] on it answers) and, when `read` is
    /// not 0 and the file is a regular file the handle can read, its first bytes (at most
    /// `read` and [`MAX_IO`]; fewer only at its end) if its size is at most `upto` (a client
    /// that keeps only files up to a size wants no bytes of a bigger one).
    OpenPlus {
        read: u32,
        upto: u64,
        how: OpenHow,
    },
    /// Feature [`features::STORE`]: on `handle`, write `data` at `offset` (at most
    /// [`MAX_IO`] bytes, EINVAL beyond; all of them, or the call fails with EIO), then set the size to
    /// `size`, then set `set` (as [`Request::FileSetattr`]; when that fails with EPERM or
    /// EACCES, not the owner, the attributes stay as the writes left them), in that order;
    /// answered with [`Reply::Attr`], the file's attributes after it. A container stored
    /// back on close in one round trip.
    Store {
        handle: u64,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        size: u64,
        set: SetAttr,
    },
}

/// The name of each kind of [`Request`], in [`Request::kind`]'s numbering (calls counted by
/// kind: `dircache stats`, `backend.calls_*`).
pub const REQUEST_KINDS: [&str; 35] = [
    "Walk",
    "Lookup",
    "Getattr",
    "Readdir",
    "Subtree",
    "Readlink",
    "Mknod",
    "Mkdir",
    "Symlink",
    "Link",
    "Unlink",
    "Rmdir",
    "Rename",
    "Setattr",
    "Statfs",
    "Getxattr",
    "Listxattr",
    "Setxattr",
    "Removexattr",
    "Fsyncdir",
    "Open",
    "OpenVerified",
    "Read",
    "Write",
    "Sync",
    "Allocate",
    "Seek",
    "SetSize",
    "FileSetattr",
    "FileAttr",
    "Close",
    "Search",
    "Cancel",
    "OpenPlus",
    "Store",
];

/// How [`Request::OpenPlus`] opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenHow {
    /// As [`Request::Open`].
    Path {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        flags: i32,
        mode: u32,
        umask: u32,
    },
    /// As [`Request::OpenVerified`].
    Verified { target: Target, flags: i32 },
}

impl OpenHow {
    /// The open's flags.
    pub fn flags(&self) -> i32 {
        match self {
            OpenHow::Path { flags, .. } | OpenHow::Verified { flags, .. } => *flags,
        }
    }
}

impl Request {
    /// This request's kind: its index in [`REQUEST_KINDS`].
    pub fn kind(&self) -> usize {
        match self {
            Request::Walk { .. } => 0,
            Request::Lookup { .. } => 1,
            Request::Getattr { .. } => 2,
            Request::Readdir { .. } => 3,
            Request::Subtree { .. } => 4,
            Request::Readlink { .. } => 5,
            Request::Mknod { .. } => 6,
            Request::Mkdir { .. } => 7,
            Request::Symlink { .. } => 8,
            Request::Link { .. } => 9,
            Request::Unlink { .. } => 10,
            Request::Rmdir { .. } => 11,
            Request::Rename { .. } => 12,
            Request::Setattr { .. } => 13,
            Request::Statfs { .. } => 14,
            Request::Getxattr { .. } => 15,
            Request::Listxattr { .. } => 16,
            Request::Setxattr { .. } => 17,
            Request::Removexattr { .. } => 18,
            Request::Fsyncdir { .. } => 19,
            Request::Open { .. } => 20,
            Request::OpenVerified { .. } => 21,
            Request::Read { .. } => 22,
            Request::Write { .. } => 23,
            Request::Sync { .. } => 24,
            Request::Allocate { .. } => 25,
            Request::Seek { .. } => 26,
            Request::SetSize { .. } => 27,
            Request::FileSetattr { .. } => 28,
            Request::FileAttr { .. } => 29,
            Request::Close { .. } => 30,
            Request::Search { .. } => 31,
            Request::Cancel { .. } => 32,
            Request::OpenPlus { .. } => 33,
            Request::Store { .. } => 34,
        }
    }

    /// The paths of the names the call may add or remove (their parents' listings and
    /// attributes change), for [`features::PARENTS`]; empty for any other call.
    pub fn names_changed(&self) -> Vec<&[u8]> {
        match self {
            Request::Mknod { path, .. }
            | Request::Mkdir { path, .. }
            | Request::Symlink { path, .. }
            | Request::Unlink { path }
            | Request::Rmdir { path } => vec![path],
            Request::Link { new, .. } => vec![new],
            Request::Rename { old, new, .. } => vec![old, new],
            Request::Open { path, flags, .. } if flags & libc::O_CREAT != 0 => vec![path],
            Request::OpenPlus {
                how: OpenHow::Path { path, flags, .. },
                ..
            } if flags & libc::O_CREAT != 0 => vec![path],
            _ => Vec::new(),
        }
    }

    /// Whether the call may change what a listing or attributes show (everything but the
    /// queries, reads and syncs).
    pub fn mutates(&self) -> bool {
        match self {
            Request::Walk { .. }
            | Request::Lookup { .. }
            | Request::Getattr { .. }
            | Request::Readdir { .. }
            | Request::Subtree { .. }
            | Request::Readlink { .. }
            | Request::Statfs { .. }
            | Request::Getxattr { .. }
            | Request::Listxattr { .. }
            | Request::Fsyncdir { .. }
            | Request::Read { .. }
            | Request::Sync { .. }
            | Request::Seek { .. }
            | Request::FileAttr { .. }
            | Request::Close { .. }
            | Request::Search { .. }
            | Request::Cancel { .. } => false,
            Request::Open { flags, .. } | Request::OpenVerified { flags, .. } => {
                flags & (libc::O_CREAT | libc::O_TRUNC) != 0
            }
            Request::OpenPlus { how, .. } => how.flags() & (libc::O_CREAT | libc::O_TRUNC) != 0,
            _ => true,
        }
    }
}

/// One entry of a [`Reply::Subtree`]: `dir` is the directory's path relative to the request's
/// `path` (empty for itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtreeDir {
    #[serde(with = "serde_bytes")]
    pub dir: Vec<u8>,
    pub entries: Vec<DirEntry>,
    /// Per entry (same order), when the server could tell: the entry has no extended
    /// attributes at all (so no ACL: `ls -l`'s `system.posix_acl_access` question is answered
    /// without a round trip). Empty when not known.
    pub bare: Vec<bool>,
}

/// What a call returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Unit,
    Attr(Attr),
    /// [`dircache_core::Walked`] with the error as an errno.
    Walked {
        attrs: Vec<Attr>,
        error: Option<i32>,
    },
    Entries(Vec<DirEntry>),
    /// Part of a subtree; `complete` (on the last frame) when the budget was not reached.
    Subtree {
        dirs: Vec<SubtreeDir>,
        complete: bool,
    },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    StatFs(StatFs),
    Opened {
        handle: u64,
        writable: bool,
    },
    Count(u64),
    /// Part of a search's results.
    Found(Vec<Found>),
    /// The answer to [`Request::OpenPlus`]: `data` is `None` when no bytes were asked for or
    /// could be read (not a regular file, a write-only handle).
    OpenedPlus {
        handle: u64,
        writable: bool,
        attr: Attr,
        data: Option<Bytes>,
    },
    /// (With [`features::NAMES`].) Part of a `Subtree` reply, never its last frame: listings
    /// with names, types and inode numbers only, but for subdirectories, which carry their
    /// attributes (`bare` empty). Each directory's full listing follows in a later
    /// [`Reply::Subtree`] frame of the same call (unless it cannot be read by then).
    Names(Vec<SubtreeDir>),
    /// (With [`features::PARENTS`].) The reply to a call that adds or removes a name, with
    /// the attributes of the directories holding those names (each once, by path), read
    /// after the call was done; a directory that could not be read is left out.
    Parents {
        parents: Vec<(Bytes, Attr)>,
        reply: Box<Reply>,
    },
}

/// One result of a [`Request::Search`] ([`dircache_core::SearchHit`] on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    pub root: u32,
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    pub attr: Option<Attr>,
    /// `(source, errno)` of an error met on the way.
    pub error: Option<(u8, i32)>,
}

/// A change pushed by the server ([`Change`] on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Callback {
    Attr(#[serde(with = "serde_bytes")] Vec<u8>),
    Entry(#[serde(with = "serde_bytes")] Vec<u8>),
    Inode { dev: u64, ino: u64 },
    Overflow,
}

impl From<&Change> for Callback {
    fn from(c: &Change) -> Callback {
        match c {
            Change::Attr { path } => Callback::Attr(path.clone()),
            Change::Entry { path } => Callback::Entry(path.clone()),
            Change::Inode { dev, ino } => Callback::Inode {
                dev: *dev,
                ino: *ino,
            },
            Change::Overflow => Callback::Overflow,
        }
    }
}

impl From<Callback> for Change {
    fn from(c: Callback) -> Change {
        match c {
            Callback::Attr(path) => Change::Attr { path },
            Callback::Entry(path) => Change::Entry { path },
            Callback::Inode { dev, ino } => Change::Inode { dev, ino },
            Callback::Overflow => Change::Overflow,
        }
    }
}

/// Server to client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMsg {
    Hello(Hello),
    /// The server refuses the connection (version mismatch, ...); it closes the stream next.
    Refused(String),
    /// The answer (or a part of it) to call `id`: `Err(errno)` or a [`Reply`].
    Reply {
        id: u64,
        last: bool,
        body: Result<Reply, i32>,
    },
    Callback(Callback),
}

/// Errors of the protocol layer.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("malformed message: {0}")]
    Decode(#[from] postcard::Error),
    #[error("the peer does not speak the dircache protocol")]
    NotDircache,
    #[error("protocol version mismatch: this side speaks {ours}, the peer {theirs}")]
    Version { ours: u32, theirs: u32 },
    #[error("server refused the connection: {0}")]
    Refused(String),
    #[error("unexpected message: {0}")]
    Unexpected(String),
    #[error("connection closed")]
    Closed,
    #[error("the server did not answer the handshake within {0:?}")]
    HandshakeTimeout(std::time::Duration),
}

/// Encode `msg` as one frame's payload.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    Ok(postcard::to_stdvec(msg)?)
}

/// Decode one frame's payload; trailing bytes are an error.
pub fn decode<'a, T: Deserialize<'a>>(payload: &'a [u8]) -> Result<T, ProtoError> {
    let (v, rest) = postcard::take_from_bytes(payload)?;
    if !rest.is_empty() {
        return Err(ProtoError::Unexpected(format!(
            "{} bytes after the message",
            rest.len()
        )));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let msgs = vec![
            ClientMsg::Hello(Hello::new(features::ALL)),
            ClientMsg::Call {
                id: 7,
                cred: WireCred {
                    uid: 1000,
                    gid: 1000,
                    groups: vec![4, 27],
                },
                req: Request::Walk {
                    dir: b"a".to_vec(),
                    names: vec![Bytes(b"b".to_vec()), Bytes(b"c\xff".to_vec())],
                },
            },
        ];
        for m in msgs {
            let b = encode(&m).unwrap();
            assert_eq!(decode::<ClientMsg>(&b).unwrap(), m);
            let mut extra = b.clone();
            extra.push(0);
            assert!(decode::<ClientMsg>(&extra).is_err());
        }
        let r = ServerMsg::Reply {
            id: 1,
            last: true,
            body: Ok(Reply::Data(vec![0u8; 1000])),
        };
        let b = encode(&r).unwrap();
        // A byte string, not 1000 varints (postcard writes u8 sequences as bytes anyway).
        assert!(b.len() < 1010, "{}", b.len());
        assert_eq!(decode::<ServerMsg>(&b).unwrap(), r);
    }
}
