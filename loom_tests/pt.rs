//! Loom model (being written).
#![cfg(aspace_loom)]
