//! placeholder crate root, replaced as the crate is built
