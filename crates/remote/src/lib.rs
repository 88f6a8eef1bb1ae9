//! # dircache-remote
//!
//! Remote trees: the dircache protocol ([`proto`], over [`frame`]s; docs/protocol.md), the
//! server ([`server::serve`], behind `dircache serve --stdio ROOT`) and the client
//! ([`client::RemoteBackend`], a [`dircache_core::Backend`] the core cache and the FUSE front
//! end serve like any other).

pub mod cached;
pub mod client;
pub mod prefetch;
pub mod proto;
pub mod server;

pub use cached::CachedBackend;
/// The framing layer, its own crate ([`dircache_frame`]) so the control socket shares it
/// without depending on this one.
pub use dircache_frame as frame;

pub use client::{
    ChildTransport, ClientConfig, ContainerConfig, ContainerStats, Containers, Disconnected,
    RemoteBackend, Transport, MAX_CALL_ENTRIES,
};
pub use server::{serve, ServerConfig};
