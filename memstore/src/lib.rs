//! The in-memory MVCC state machine (see the crate README).
