//! dircache-fuse (under construction)
