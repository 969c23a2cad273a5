//! The address space (being written).
pub mod config;
pub mod flags;
pub mod mmap_lock;

pub use config::{Config, FaultLocking};
pub use flags::{Access, Advice, MapFlags, MremapFlags, Prot};
