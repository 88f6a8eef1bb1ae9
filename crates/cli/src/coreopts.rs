//! The core cache's optimizations (`dircache_core::Config`) as mount options, so that each can
//! be measured on and off through a mount: `-o nocompleteness`, `-o nonegatives`, ...
//! (`dotdot` is not one: the kernel resolves `..` itself before FUSE sees a name.)

use dircache_core::Config;

/// One switch: its option name, what it is, and where it acts.
pub struct Switch {
    pub name: &'static str,
    set: fn(&mut Config, bool),
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for Switch {
    fn eq(&self, other: &Switch) -> bool {
        self.name == other.name
    }
}

/// Every boolean switch of `Config` but `bypass` (which is `-o bypass`, with the kernel side).
pub const SWITCHES: [Switch; 8] = [
    Switch {
        name: "fastpath",
        set: |c, on| c.fastpath = on,
    },
    Switch {
        name: "verify_path",
        set: |c, on| c.verify_path = on,
    },
    Switch {
        name: "completeness",
        set: |c, on| c.completeness = on,
    },
    Switch {
        name: "negatives",
        set: |c, on| c.negatives = on,
    },
    Switch {
        name: "deep_negatives",
        set: |c, on| c.deep_negatives = on,
    },
    Switch {
        name: "symlink_aliases",
        set: |c, on| c.symlink_aliases = on,
    },
    Switch {
        name: "walk_batch",
        set: |c, on| c.walk_batch = on,
    },
    Switch {
        name: "protected_hardlinks",
        set: |c, on| c.protected_hardlinks = on,
    },
];

/// Largest `-o pcc_slots` accepted (8 bytes each, per credential).
pub const MAX_PCC_SLOTS: usize = 1 << 24;

/// `(on, switch)` if `opt` (`name` or `noname`) is a core switch.
pub fn parse(opt: &str) -> Option<(bool, &'static Switch)> {
    let (on, name) = match opt.strip_prefix("no") {
        Some(n) if SWITCHES.iter().any(|s| s.name == n) => (false, n),
        _ => (true, opt),
    };
    SWITCHES.iter().find(|s| s.name == name).map(|s| (on, s))
}

/// `config` with the switches given, in order (the last word on a switch wins).
pub fn apply(config: &mut Config, switches: &[(bool, &'static Switch)]) {
    for (on, s) in switches {
        (s.set)(config, *on);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_switch_moves_its_field_and_only_it() {
        let fields = |c: &Config| {
            [
                c.fastpath,
                c.verify_path,
                c.completeness,
                c.negatives,
                c.deep_negatives,
                c.symlink_aliases,
                c.walk_batch,
                c.protected_hardlinks,
            ]
        };
        for (i, s) in SWITCHES.iter().enumerate() {
            for on in [false, true] {
                let mut c = Config::default();
                let before = fields(&c);
                apply(&mut c, &[(on, s)]);
                let after = fields(&c);
                for j in 0..SWITCHES.len() {
                    let want = if j == i { on } else { before[j] };
                    assert_eq!(
                        after[j],
                        want,
                        "-o {}{}",
                        if on { "" } else { "no" },
                        s.name
                    );
                }
            }
        }
        assert!(parse("nonegatives").is_some_and(|(on, s)| !on && s.name == "negatives"));
        assert!(parse("negatives").is_some_and(|(on, _)| on));
        assert!(parse("notarealswitch").is_none());
        assert!(parse("nofoo").is_none());
    }
}
