//! The sequence-counted mmap_lock (being written).
