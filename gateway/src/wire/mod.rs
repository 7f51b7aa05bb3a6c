//! Wire formats: what clients send and receive, exactly as the public APIs define them.

pub mod anthropic;
pub mod one_or_many;
pub mod openai;
pub mod responses;
