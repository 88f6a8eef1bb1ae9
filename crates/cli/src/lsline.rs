//! `ls -l`-style lines for `dircache search --stat`: mode string with set-id and sticky bits,
//! link count, owner and group names (numeric when unknown), size (or `major, minor` for
//! devices) and the modification time in local time, as GNU `ls -l` prints it (`Mon dd HH:MM`
//! within the last six months, `Mon dd  YYYY` otherwise).

use std::collections::HashMap;
use std::fmt::Write;

use dircache_core::Attr;

/// Six months, as `ls` counts them (half of a Gregorian year).
const SIX_MONTHS: i64 = 31_556_952 / 2;

/// Formats `ls -l` lines; remembers the names of the ids it has looked up.
pub struct LsLine {
    now: i64,
    tz: jiff::tz::TimeZone,
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Default for LsLine {
    fn default() -> Self {
        Self::new()
    }
}

impl LsLine {
    pub fn new() -> LsLine {
        LsLine {
            now: jiff::Timestamp::now().as_second(),
            tz: jiff::tz::TimeZone::system(),
            users: HashMap::new(),
            groups: HashMap::new(),
        }
    }

    /// The line's prefix for `st`, up to and including the space before the path.
    pub fn prefix(&mut self, st: &Attr) -> String {
        let user = self
            .users
            .entry(st.uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(st.uid.into())
                    .ok()
                    .flatten()
                    .map_or_else(|| st.uid.to_string(), |u| u.name)
            })
            .clone();
        let group = self
            .groups
            .entry(st.gid)
            .or_insert_with(|| {
                nix::unistd::Group::from_gid(st.gid.into())
                    .ok()
                    .flatten()
                    .map_or_else(|| st.gid.to_string(), |g| g.name)
            })
            .clone();
        let size = match st.mode & libc::S_IFMT {
            libc::S_IFCHR | libc::S_IFBLK => format!(
                "{}, {}",
                libc::major(st.rdev as libc::dev_t),
                libc::minor(st.rdev as libc::dev_t)
            ),
            _ => st.size.to_string(),
        };
        let mut s = String::with_capacity(64);
        let _ = write!(
            s,
            "{} {:>3} {:<8} {:<8} {:>8} {} ",
            mode_string(st.mode),
            st.nlink,
            user,
            group,
            size,
            self.date(st.mtime.sec)
        );
        s
    }

    fn date(&self, sec: i64) -> String {
        let Ok(t) = jiff::Timestamp::from_second(sec) else {
            // Out of jiff's range (years beyond ±9999): the raw seconds, as ls does.
            return format!("{sec:>12}");
        };
        let z = t.to_zoned(self.tz.clone());
        let recent = sec <= self.now && self.now - sec < SIX_MONTHS;
        z.strftime(if recent { "%b %e %H:%M" } else { "%b %e  %Y" })
            .to_string()
    }
}

/// `drwxr-sr-t`: the file type and the permission bits, with set-uid, set-gid and sticky
/// shown as `ls` does (`s`/`S`, `s`/`S`, `t`/`T`).
pub fn mode_string(mode: u32) -> String {
    let t = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    let special = [
        (6u32, libc::S_ISUID, 's'),
        (3, libc::S_ISGID, 's'),
        (0, libc::S_ISVTX, 't'),
    ];
    for (shift, bit, mark) in special {
        let b = (mode >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        let x = b & 1 != 0;
        s.push(match (mode & bit != 0, x) {
            (true, true) => mark,
            (true, false) => mark.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings_as_ls_prints_them() {
        for (mode, want) in [
            (libc::S_IFREG | 0o644, "-rw-r--r--"),
            (libc::S_IFDIR | 0o1777, "drwxrwxrwt"),
            (libc::S_IFDIR | 0o1770, "drwxrwx--T"),
            (libc::S_IFREG | 0o4755, "-rwsr-xr-x"),
            (libc::S_IFREG | 0o4644, "-rwSr--r--"),
            (libc::S_IFREG | 0o2750, "-rwxr-s---"),
            (libc::S_IFREG | 0o2640, "-rw-r-S---"),
            (libc::S_IFLNK | 0o777, "lrwxrwxrwx"),
            (libc::S_IFCHR | 0o620, "crw--w----"),
        ] {
            assert_eq!(mode_string(mode), want, "mode {mode:o}");
        }
    }
}
