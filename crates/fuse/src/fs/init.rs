//! Capability negotiation at INIT: what the front end asks of the kernel, and why.

use super::*;

impl CacheFs {
    /// INIT: the FUSE capabilities the policy asks for and the kernel offers.
    pub(super) fn init(&mut self, config: &mut KernelConfig) {
        let caps = config.capabilities();
        let p = &self.policy;
        // FUSE_DONT_MASK: the caller's umask comes with each creation; the backend's file
        // system applies it unless the parent has a default ACL (crate::umask).
        // No FUSE_EXPORT_SUPPORT, and FUSE_NO_EXPORT_SUPPORT: the kernel's file handles
        // name (nodeid, generation), and after the kernel forgot an inode (memory pressure,
        // drop_caches) or a remount, a path-based daemon cannot find a file from its inode
        // number, so open_by_handle_at would give ESTALE for files that still exist. Not
        // offered, name_to_handle_at fails cleanly with EOPNOTSUPP (fanotify's FID-only
        // handles still work).
        // No FUSE_ATOMIC_O_TRUNC: with it the daemon truncates in OPEN, before the kernel's
        // busy check, and open(running program, O_RDONLY|O_TRUNC) emptied the program before
        // failing with ETXTBSY. Without it the kernel checks, then sends SETATTR(size 0).
        // FUSE_HANDLE_KILLPRIV_V2: the daemon kills set-user-ID/set-group-ID bits and file
        // capabilities on write, truncate and chown (it does: every write, truncation and
        // chown runs as the caller without CAP_FSETID, so the backing file system kills them
        // as for that user). The kernel then marks the super block SB_NOSEC and stops asking
        // for `security.capability` before every write (one GETXATTR per write before; now
        // at most one per inode).
        let mut want = InitFlags::FUSE_NO_EXPORT_SUPPORT
            | InitFlags::FUSE_HANDLE_KILLPRIV
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DONT_MASK;
        if p.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS;
        }
        if p.parallel_dirops {
            want |= InitFlags::FUSE_PARALLEL_DIROPS;
        }
        if p.cache_symlinks {
            want |= InitFlags::FUSE_CACHE_SYMLINKS;
        }
        if p.no_opendir {
            want |= InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        }
        if p.posix_acl {
            want |= InitFlags::FUSE_POSIX_ACL;
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        // Passthrough reads go to a backing file on SRC's own mount, whose atime rule (not
        // this mount's noatime) applies, and the kernel copies the user's open flags into it
        // (no O_NOATIME): on a noatime mount, reads go through the daemon's descriptors.
        if self.noatime && p.passthrough {
            tracing::info!("noatime: passthrough off, so that reads leave atimes alone");
        }
        // open=noopen: no OPEN reply to carry a backing id (fs/noopen.rs).
        if p.passthrough
            && !p.no_open
            && !self.noatime
            && root
            && caps.contains(InitFlags::FUSE_PASSTHROUGH)
        {
            want |= InitFlags::FUSE_PASSTHROUGH;
            if config.set_max_stack_depth(2).is_ok() {
                self.passthrough = true;
            }
        }
        let missing = want & !caps;
        if !missing.is_empty() {
            tracing::info!("kernel lacks FUSE capabilities {missing:?}");
        }
        if let Err(e) = config.add_capabilities(want & caps) {
            tracing::warn!("could not enable {e:?}");
        }
        let _ = config.set_max_background(64);
        tracing::info!(
            "FUSE {:?}, passthrough {}, policy {:?}",
            config.kernel_abi(),
            self.passthrough,
            self.policy
        );
    }
}
