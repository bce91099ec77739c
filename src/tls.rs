//! The process's TLS crypto provider: ring, for every rustls user (the Redis
//! client, reqwest under Entra ID, Blob and Queue Storage, Event Grid and the
//! telemetry exporters).
//!
//! The tree compiles rustls without aws-lc-rs (a C library built with CMake
//! in every build), so reqwest has no provider of its own and panics when a
//! client is built before one is installed. Each part that builds a client
//! calls [`install_crypto_provider`] first: no caller has to remember an order.

/// Install ring as the process's default rustls provider. Idempotent and
/// cheap after the first call; a provider installed earlier (by an embedder)
/// is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
