//! Virtual memory areas (being written).
pub mod lock;
