//! Pipeline ops, one file per family: decoding, crop/resize geometry, resampling, the output
//! tensor format; tokenising text and packing it into rows.

pub mod decode;
pub mod geometry;
pub mod pack;
pub mod resample;
pub mod tensor;
pub mod tokenize;
