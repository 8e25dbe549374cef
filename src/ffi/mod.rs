//! The C boundary: ggml's ABI mirrored in Rust (`abi`), ggml functions found at run time
//! (`ggml_rt`), logging through ggml (`log`), panic containment (`guard`), the vtables over
//! our devices (`vtables`; the backend's in `backend_vtable`), the row split's buffer type (`split`), tensor parallelism's AllReduce (`comm`), pinning RFCPU memory for a GPU (`pin`), the registry (`registry`),
//! the exported functions (`exports`) and the versions built for (`version`).
//! Calls go one way only: exports -> registry -> vtables -> the devices (`crate::device`).

pub mod abi;
pub mod comm;
pub mod exports;
pub mod ggml_rt;
pub mod guard;
pub mod hybrid_exports;
#[macro_use]
pub mod log;
pub mod pin;
pub mod registry;
pub mod split;
pub mod version;
pub mod vtables;
// After `log` (its macros) and `vtables`.
pub mod backend_vtable;
