//! Pipeline ops, one file per family: decoding, crop/resize geometry, resampling, and the
//! output tensor format.

pub mod decode;
pub mod geometry;
pub mod resample;
pub mod tensor;
