//! apps
extern crate blas_src;
