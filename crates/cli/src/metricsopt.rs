//! `-o metrics=ADDR:PORT` and `-o metrics_public`: where the mount serves its metrics
//! (`dircache_fuse::metrics`).
//!
//! Only loopback addresses are accepted unless `metrics_public` is given too: the endpoint
//! has no authentication, and its counters and latencies show what the mount's users do and
//! when (a side channel on their activity), so exposing it to the network is a decision to
//! make on purpose (and then to firewall).

use std::net::SocketAddr;

use crate::mount::Usage;

/// The value of `-o metrics=`: an IP address and a port (`127.0.0.1:9477`, `[::1]:9477`;
/// port 0: any free one, shown by `dircache stats`).
pub fn addr(v: Option<&str>) -> Result<SocketAddr, Usage> {
    let v = v.unwrap_or("");
    v.parse::<SocketAddr>().map_err(|_| {
        Usage(format!(
            "bad value for -o metrics: {v:?} (ADDR:PORT expected, e.g. 127.0.0.1:9477 or [::1]:9477)"
        ))
    })
}

/// Refuse a non-loopback address without `metrics_public`.
pub fn check(addr: Option<SocketAddr>, public: bool) -> Result<(), Usage> {
    match addr {
        Some(a) if !public && !dircache_fuse::metrics::is_private(&a) => Err(Usage(format!(
            "-o metrics={a}: not a loopback address; the metrics endpoint has no \
             authentication and shows the mount's activity, so add -o metrics_public to \
             serve it to the network on purpose"
        ))),
        None if public => Err(Usage(
            "-o metrics_public without -o metrics=ADDR:PORT".into(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(addr(Some("127.0.0.1:9477")).unwrap().port(), 9477);
        assert!(addr(Some("[::1]:0")).is_ok());
        assert!(addr(Some("localhost:9477")).is_err());
        assert!(addr(Some("127.0.0.1")).is_err());
        assert!(addr(None).is_err());
        assert!(check(Some(addr(Some("127.0.0.1:1")).unwrap()), false).is_ok());
        assert!(check(Some(addr(Some("0.0.0.0:1")).unwrap()), false).is_err());
        assert!(check(Some(addr(Some("[::]:1")).unwrap()), false).is_err());
        assert!(check(Some(addr(Some("0.0.0.0:1")).unwrap()), true).is_ok());
        assert!(check(None, true).is_err());
        assert!(check(None, false).is_ok());
    }
}
