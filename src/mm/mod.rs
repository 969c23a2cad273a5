//! The address space (being written).
pub mod mmap_lock;
