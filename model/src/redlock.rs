//! Model 3 (being written).
pub const MODEL: &str = "redlock";
