//! dircache-local (under construction)
