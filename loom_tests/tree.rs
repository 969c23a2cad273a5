//! Loom model of the range tree (being written).
#![cfg(aspace_loom)]
