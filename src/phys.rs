//! Physical frames (being written).
