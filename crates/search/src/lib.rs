//! dircache-search (under construction)
