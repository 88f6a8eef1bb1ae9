//! Profiling aid: the cache's own part of a chmod and a rename of a directory with 10,000 cached
//! descendants (100 directories of 99 files), memory backend with the mutations stubbed out,
//! in the order of `dircache bench lookup --only invalidate`.
//! `cargo run --release -p dircache-core --example renameloop [rounds]`
use std::sync::Arc;
use std::time::Instant;

use dircache_core::memory::MemoryBackend;
use dircache_core::{
    At, Attr, Backend, Cache, Config, Cred, DirEntry, LookupFlags, RenameMode, Result, SetAttr,
    StatFs, Walked,
};

/// Reads go to the memory backend; `rename` and `setattr` do nothing (the cache's part alone).
struct Stub(MemoryBackend);

impl Backend for Stub {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        self.0.lookup(dir, name)
    }
    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        self.0.walk(dir, names)
    }
    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.0.getattr(path)
    }
    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        self.0.readdir(path, plus)
    }
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.0.readlink(path)
    }
    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        self.0.mknod(cred, path, mode, rdev)
    }
    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        self.0.mkdir(cred, path, mode)
    }
    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        self.0.symlink(cred, target, path)
    }
    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        self.0.link(cred, old, new)
    }
    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.0.unlink(cred, path)
    }
    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.0.rmdir(cred, path)
    }
    fn rename(&self, _: &Cred, _: &[u8], _: &[u8], _: RenameMode) -> Result<()> {
        Ok(())
    }
    fn setattr(&self, _: &Cred, path: &[u8], _: &SetAttr) -> Result<Attr> {
        self.0.getattr(path)
    }
    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        self.0.statfs(path)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let b = MemoryBackend::new();
    let mut desc = Vec::new();
    for s in 0..100 {
        desc.push(format!("s{s:03}"));
        for f in 0..99 {
            desc.push(format!("s{s:03}/f{f:02}.c"));
        }
    }
    let full: Vec<String> = desc
        .iter()
        .filter(|d| d.contains('/'))
        .map(|d| format!("inv/n10000/{d}"))
        .collect();
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    b.populate(&refs);
    b.populate(&["inv/n100/f000", "inv/n1000/f000"]);
    let cache = Cache::new(Arc::new(Stub(b)), Config::default()).expect("cache");
    let c = cache.credentials(Cred::root());
    let dir = "inv/n10000";
    let renamed = "inv/n10000.renamed";
    let populate = || {
        for d in &desc {
            let p = format!("{dir}/{d}");
            cache
                .stat(&c, At::Root, p.as_bytes(), LookupFlags::NOFOLLOW)
                .expect("populate");
        }
    };
    let (mut ch, mut rn) = (Vec::new(), Vec::new());
    let mut flip = false;
    for _ in 0..rounds {
        populate();
        flip = !flip;
        let set = SetAttr {
            mode: Some(if flip { 0o751 } else { 0o755 }),
            ..SetAttr::default()
        };
        let t = Instant::now();
        cache
            .setattr(&c, At::Root, dir.as_bytes(), &set, LookupFlags::NOFOLLOW)
            .expect("chmod");
        ch.push(t.elapsed().as_nanos() as f64 / 1000.0);
        populate();
        let t = Instant::now();
        cache
            .rename(
                &c,
                At::Root,
                dir.as_bytes(),
                renamed.as_bytes(),
                RenameMode::Replace,
            )
            .expect("rename");
        rn.push(t.elapsed().as_nanos() as f64 / 1000.0);
        cache
            .rename(
                &c,
                At::Root,
                renamed.as_bytes(),
                dir.as_bytes(),
                RenameMode::Replace,
            )
            .expect("rename back");
    }
    let (cmin, rmin) = (
        ch.iter().copied().fold(f64::MAX, f64::min),
        rn.iter().copied().fold(f64::MAX, f64::min),
    );
    println!(
        "chmod 10k: median {:.1} us (min {cmin:.1}); rename 10k: median {:.1} us (min {rmin:.1}); invalidated {}",
        median(&mut ch),
        median(&mut rn),
        cache.stats().invalidated_entries
    );
}
