//! store-client
