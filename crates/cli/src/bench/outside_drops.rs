//! Cache drops made by other programs on the machine: `echo N > /proc/sys/vm/drop_caches`
//! empties the dentry, inode and page caches of every file system (negative dentries and
//! unused directory dentries of a FUSE mount too: the kernel FORGETs them and LOOKUPs each
//! again). A warm run with such a drop since the previous run is not warm; the kernel
//! counts every drop in /proc/vmstat (`drop_pagecache`, `drop_slab`).

/// Drops so far (both kinds), or None where /proc/vmstat has no drop counters.
pub fn count() -> Option<u64> {
    parse(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

/// The sum of `drop_pagecache` and `drop_slab` in /proc/vmstat's text.
fn parse(vmstat: &str) -> Option<u64> {
    let mut found = None;
    for line in vmstat.lines() {
        let mut f = line.split_whitespace();
        if let (Some("drop_pagecache" | "drop_slab"), Some(n)) = (f.next(), f.next()) {
            found = Some(found.unwrap_or(0) + n.parse::<u64>().ok()?);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn sums_both_drop_counters() {
        let v = "nr_free_pages 4\ndrop_pagecache 9659\ndrop_slab 9721\npginodesteal 7\n";
        assert_eq!(parse(v), Some(9659 + 9721));
        assert_eq!(parse("drop_slab 3\n"), Some(3));
    }

    #[test]
    fn none_without_counters_or_on_garbage() {
        assert_eq!(parse("nr_free_pages 4\n"), None);
        assert_eq!(parse("drop_slab x\n"), None);
    }
}
