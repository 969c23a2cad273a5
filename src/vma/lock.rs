//! The per-VMA refcount lock (being written).
