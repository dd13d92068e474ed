//! bsp
