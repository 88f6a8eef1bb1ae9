//! An in-memory backend, for unit tests only (integration tests use the local backend).
