//! The held-node contract (`cache/held.rs`) on the in-memory backend, without root: a node a
//! front end holds stays pinned, is found again after outside moves, and its attributes are
//! served fresh when they may have changed behind the core's copy; the xattr-absence memo is
//! dropped when attributes change.
//!
//! Changes "from outside" are made on the backend object directly (as root), reported to the
//! cache with `apply_change` only where a test says so (a change feed's report).

use std::sync::Arc;

use dircache_core::memory::MemoryBackend;
use dircache_core::{Backend, Cache, Change, Config, Cred, Held, NodeRef, SetAttr};

fn setup(spec: &[&str], config: Config) -> (Arc<MemoryBackend>, Arc<Cache>) {
    let b = Arc::new(MemoryBackend::with_watch());
    b.populate(spec);
    let c = Cache::new(b.clone(), config).expect("cache");
    (b, c)
}

/// Look `name` up in held directory `parent` and hold it (what a FUSE LOOKUP reply does).
fn hold(cache: &Cache, parent: &Held, name: &str) -> (NodeRef, Held) {
    let c = cache.kernel_checked(Cred::root());
    let dir = cache.held_node(parent).expect("parent");
    let n = cache
        .lookup_child(&c, &dir, name.as_bytes())
        .expect("lookup");
    let a = cache.attr_of_name(&n).expect("attr");
    let h = cache.hold(&n, &a, Some(parent));
    (n, h)
}

fn chmod(b: &MemoryBackend, path: &str, mode: u32) {
    let set = SetAttr {
        mode: Some(mode),
        ..Default::default()
    };
    b.setattr(&Cred::root(), path.as_bytes(), &set)
        .expect("chmod");
}

fn change(cache: &Cache, c: Change) {
    cache.apply_change(&c);
}

fn entry(p: &str) -> Change {
    Change::Entry {
        path: p.as_bytes().to_vec(),
    }
}

fn attr(p: &str) -> Change {
    Change::Attr {
        path: p.as_bytes().to_vec(),
    }
}

/// A held directory whose parent is renamed from outside, then changed, is still the live
/// node of its inode and is served fresh.
#[test]
fn held_node_follows_an_outside_rename_and_stays_fresh() {
    let (b, cache) = setup(&["a/d/f"], Config::default());
    let root = cache.hold_root();
    let (_, a) = hold(&cache, &root, "a");
    let (d0, d) = hold(&cache, &a, "d");
    assert_eq!(cache.attr_for_reply(&d, &d0).unwrap().mode & 0o7777, 0o755);

    b.rename(
        &Cred::root(),
        b"a",
        b"b",
        dircache_core::RenameMode::Replace,
    )
    .unwrap();
    change(&cache, entry("a"));
    change(&cache, entry("b"));
    chmod(&b, "b/d", 0o700);
    change(&cache, attr("b/d"));

    let n = cache.held_node(&d).expect("held node");
    assert!(
        !n.is_dead(),
        "the held directory must be live after the move"
    );
    assert_eq!(cache.node_path(&n).unwrap(), b"b/d");
    let got = cache.attr_for_reply(&d, &n).unwrap();
    assert_eq!(got.mode & 0o7777, 0o700, "a held node must be served fresh");
}

/// Everything below the root was dropped (lost events): the held nodes are found again by
/// the names the holder knows, and serve what the backend has now.
#[test]
fn held_nodes_are_found_again_after_an_overflow() {
    let (b, cache) = setup(&["d/f"], Config::default());
    let root = cache.hold_root();
    let (_, d) = hold(&cache, &root, "d");
    let (f0, f) = hold(&cache, &d, "f");
    let key = f.key();

    change(&cache, Change::Overflow);
    assert!(f0.is_dead(), "an overflow drops every cached entry");
    chmod(&b, "d/f", 0o600);

    let n = cache.held_node(&f).expect("held node");
    assert!(
        !n.is_dead(),
        "the held file must be found again by its name"
    );
    let a = cache.attr_for_reply(&f, &n).unwrap();
    assert_eq!((a.dev, a.ino), key);
    assert_eq!(a.mode & 0o7777, 0o600);
    // The dead name is still there, but the live one is preferred.
    assert!(f.has_name(&f0) && f.has_name(&n));
    assert!(Arc::ptr_eq(&f.node(), &n));
}

/// A name that now stands for another inode is not taken for the held one.
#[test]
fn held_node_is_not_revived_as_another_inode() {
    let (b, cache) = setup(&["d/f"], Config::default());
    let root = cache.hold_root();
    let (_, d) = hold(&cache, &root, "d");
    let (f0, f) = hold(&cache, &d, "f");

    b.unlink(&Cred::root(), b"d/f").unwrap();
    b.mknod(&Cred::root(), b"d/f", libc::S_IFREG | 0o644, 0)
        .unwrap();
    change(&cache, entry("d/f"));
    assert!(f0.is_dead());
    let n = cache.held_node(&f).expect("held node");
    assert!(
        n.is_dead(),
        "a new file under the old name is another inode"
    );
    assert!(cache.attr_for_reply(&f, &n).is_err());
}

/// A held hard link sees a chmod made through another name, even when nobody told the
/// cache (the core's copy of its attributes is stale).
#[test]
fn held_hard_link_sees_the_other_names_chmod() {
    let (b, cache) = setup(&["x"], Config::default());
    b.link(&Cred::root(), b"x", b"y").unwrap();
    let root = cache.hold_root();
    let (x0, x) = hold(&cache, &root, "x");
    assert_eq!(cache.getattr(&x0).unwrap().nlink, 2);

    chmod(&b, "y", 0o600);
    // The plain cached copy is behind: this is what the contract must not serve.
    assert_eq!(cache.getattr(&x0).unwrap().mode & 0o7777, 0o644);
    let got = cache.attr_for_reply(&x, &x0).unwrap();
    assert_eq!(got.mode & 0o7777, 0o600);
}

/// While a writer has the file open its attributes come from the backend (writes through a
/// descriptor or a mapping move size and times without telling the cache); after the last
/// close the cached copy serves again.
#[test]
fn attributes_are_fresh_while_open_for_writing() {
    let (b, cache) = setup(&["f"], Config::default());
    let root = cache.hold_root();
    let (f0, f) = hold(&cache, &root, "f");
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().size, 0);

    cache.note_open(&f, true);
    assert!(f.has_writers());
    let grow = SetAttr {
        size: Some(100),
        ..Default::default()
    };
    b.setattr(&Cred::root(), b"f", &grow).unwrap();
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().size, 100);
    cache.note_close(&f, true);
    assert!(!f.has_writers());
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().size, 100);

    // Closed: a change nobody reports is not seen (the cache serves its copy), which shows
    // the freshness above came from the open writer.
    let grow = SetAttr {
        size: Some(200),
        ..Default::default()
    };
    b.setattr(&Cred::root(), b"f", &grow).unwrap();
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().size, 100);
}

/// A close leaves nothing cached from before it: the writes of a handle go past the core
/// (passthrough, a mapping), and the first reply after the close must not be the copy
/// cached before them. The FUSE front end forgot that copy only after the handle had stopped
/// counting, and a GETATTR that reached the daemon in between (the kernel sends RELEASE in
/// the background at close, and the `stat` that follows at once) was answered with the
/// attributes of the CREATE: `os.stat` right after mkstemp + write + close showed size 0
/// (`crates/fuse/tests/tools.rs`, `python_import_and_mkstemp_loop`, 3 of 40 runs beside 3
/// busy loops; a 2 ms sleep put between the two steps made it 287 of 300 files), and after
/// a write-only append the kernel kept the old size for the attribute TTL (torture seed 102).
#[test]
fn a_close_leaves_no_attributes_from_before_it() {
    let (b, cache) = setup(&["f"], Config::default());
    let root = cache.hold_root();
    let (f0, f) = hold(&cache, &root, "f");
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().size, 0);
    cache.note_open(&f, true);
    // The handle's writes (the kernel's, on the backing file), with no reply meanwhile.
    let grow = SetAttr {
        size: Some(19),
        ..Default::default()
    };
    b.setattr(&Cred::root(), b"f", &grow).unwrap();
    cache.note_close(&f, true);
    // What a GETATTR gets once the handle stopped counting, with nothing in between.
    assert_eq!(
        cache.attr_for_reply(&f, &f0).unwrap().size,
        19,
        "the size cached before the handle's writes, served after its close"
    );
}

/// A change through another name (a mutation the front end made) marks the held inode
/// changed: the next reply asks the backend.
#[test]
fn held_changed_makes_the_next_reply_fresh() {
    let (b, cache) = setup(&["f"], Config::default());
    let root = cache.hold_root();
    let (f0, f) = hold(&cache, &root, "f");
    chmod(&b, "f", 0o600);
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().mode & 0o7777, 0o644);
    cache.held_changed(&f);
    assert!(f.is_stale());
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().mode & 0o7777, 0o600);
    assert!(!f.is_stale());
}

/// The xattr-absence memo is dropped when the file's attributes change, through the front
/// end (`held_changed`/`forget_attr`) or from outside (`apply_change`), an absence learned
/// across a change is not remembered, and one learnt of a file is not another's that reused
/// its inode number (another birth time).
#[test]
fn xattr_absence_memo_is_dropped_on_attribute_changes() {
    let (_b, cache) = setup(&["f"], Config::default());
    let root = cache.hold_root();
    let (_, f) = hold(&cache, &root, "f");
    let key = f.key();
    // The birth of the file the absence was learnt of.
    let b = 7;

    let g = cache.xattr_memo_gen();
    cache.note_xattr_absent(key, b, 1, g);
    assert!(cache.xattr_known_absent(key, b, 1));
    assert!(!cache.xattr_known_absent(key, b, 2));
    // Another file that reused the inode number: not answered for.
    assert!(!cache.xattr_known_absent(key, b + 1, 1));
    cache.held_changed(&f);
    assert!(
        !cache.xattr_known_absent(key, b, 1),
        "changed through the front end"
    );

    let g = cache.xattr_memo_gen();
    cache.note_xattr_absent(key, b, 1, g);
    assert!(cache.xattr_known_absent(key, b, 1));
    change(&cache, attr("f"));
    assert!(!cache.xattr_known_absent(key, b, 1), "changed from outside");

    // Learned before a change, noted after it: not remembered.
    let g = cache.xattr_memo_gen();
    change(&cache, attr("f"));
    cache.note_xattr_absent(key, b, 1, g);
    assert!(!cache.xattr_known_absent(key, b, 1));
}

/// Held names are pinned: cache pressure never evicts them (an evicted name is updated by
/// nobody); released, they may go.
#[test]
fn held_nodes_are_not_evicted_until_released() {
    let names: Vec<String> = (0..400).map(|i| format!("d/f{i}")).collect();
    let spec: Vec<&str> = names.iter().map(String::as_str).collect();
    let config = Config {
        max_entries: 64,
        ..Config::default()
    };
    let (b, cache) = setup(&spec, config);
    let root = cache.hold_root();
    let (_, d) = hold(&cache, &root, "d");
    let (f0, f) = hold(&cache, &d, "f0");
    let c = cache.kernel_checked(Cred::root());
    let dir = cache.held_node(&d).unwrap();
    for i in 1..400 {
        cache
            .lookup_child(&c, &dir, format!("f{i}").as_bytes())
            .unwrap();
    }
    assert!(!f0.is_evicted() && !f0.is_dead(), "a held name was evicted");
    // An outside change still reaches it.
    chmod(&b, "d/f0", 0o600);
    change(&cache, attr("d/f0"));
    assert_eq!(cache.attr_for_reply(&f, &f0).unwrap().mode & 0o7777, 0o600);

    cache.release(&f);
    drop(f);
    for i in 1..400 {
        cache
            .lookup_child(&c, &dir, format!("f{i}").as_bytes())
            .unwrap();
    }
    assert!(f0.is_evicted(), "a released name is evictable again");
}

/// `names_inode` tells whether a name still stands for the inode in the backend, before the
/// cache heard of its removal; `on_held` then reaches the file through its remaining name.
#[test]
fn a_removed_hard_link_falls_back_to_the_other_name() {
    let (b, cache) = setup(&["x"], Config::default());
    b.link(&Cred::root(), b"x", b"y").unwrap();
    let root = cache.hold_root();
    let (x0, x) = hold(&cache, &root, "x");
    let c = cache.kernel_checked(Cred::root());
    let y0 = cache.lookup_child(&c, &cache.root(), b"y").unwrap();
    x.add_name(&y0, false);
    assert!(cache.names_inode(&x0, x.key()));

    b.unlink(&Cred::root(), b"x").unwrap();
    assert!(!cache.names_inode(&x0, x.key()));
    assert!(cache.names_inode(&y0, x.key()));
    // An operation that goes to the backend by path: fails on "x", works on "y".
    let backend = cache.backend().clone();
    let got = cache.on_held(&x, |n| backend.getattr(&cache.node_path(n)?));
    assert_eq!(got.unwrap().ino, x.key().1);
    assert!(
        Arc::ptr_eq(&x.names()[0], &y0),
        "the name that worked is preferred"
    );
}
