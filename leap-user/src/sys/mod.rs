//! Thin, unsafe-containing wrappers around the system calls leap needs that
//! std and socket2 do not offer (batched UDP I/O with GSO/GRO). Everything
//! above this module is safe code.

pub mod udp;
