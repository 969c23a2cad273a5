//! vmalloc-style virtual-area allocator (being written).
