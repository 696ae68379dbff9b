//! A tensor's elements read back as numbers: its bytes are little-endian values of its dtype.

use crate::v1::{Dtype, Tensor};

/// A number type a tensor can hold.
pub trait Element: Copy {
    /// The dtype of tensors of this type.
    const DTYPE: Dtype;
    /// Its width in bytes.
    const BYTES: usize;
    /// The value of `BYTES` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($type:ty, $dtype:ident) => {
        impl Element for $type {
            const DTYPE: Dtype = Dtype::$dtype;
            const BYTES: usize = std::mem::size_of::<$type>();
            fn from_le(bytes: &[u8]) -> Self {
                let mut array = [0; std::mem::size_of::<$type>()];
                array.copy_from_slice(bytes);
                <$type>::from_le_bytes(array)
            }
        }
    };
}

element!(u8, Uint8);
element!(u16, Uint16);
element!(u32, Uint32);
element!(i32, Int32);
element!(i64, Int64);
element!(f32, Float32);

impl Tensor {
    /// The tensor's elements as `T`; `None` when its dtype is not `T`'s or its bytes are not a
    /// whole number of elements.
    pub fn elements<T: Element>(&self) -> Option<Vec<T>> {
        if self.dtype != T::DTYPE as i32 || self.data.len() % T::BYTES != 0 {
            return None;
        }
        Some(self.data.chunks_exact(T::BYTES).map(T::from_le).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dtype: Dtype, data: Vec<u8>) -> Tensor {
        Tensor {
            name: "t".into(),
            dtype: dtype as i32,
            shape: vec![],
            data: data.into(),
        }
    }

    #[test]
    fn elements_are_read_little_endian_in_the_tensors_dtype() {
        let ints = tensor(
            Dtype::Int64,
            [-2i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        assert_eq!(ints.elements::<i64>(), Some(vec![-2, 7]));
        let floats = tensor(Dtype::Float32, 1.5f32.to_le_bytes().to_vec());
        assert_eq!(floats.elements::<f32>(), Some(vec![1.5]));
        let tokens = tensor(Dtype::Uint16, vec![1, 2, 3, 4]);
        assert_eq!(tokens.elements::<u16>(), Some(vec![0x0201, 0x0403]));
    }

    #[test]
    fn another_dtype_or_a_cut_element_is_none() {
        let ints = tensor(Dtype::Int64, vec![0; 16]);
        assert_eq!(ints.elements::<f32>(), None);
        assert_eq!(ints.elements::<i32>(), None);
        let cut = tensor(Dtype::Int32, vec![0; 6]);
        assert_eq!(cut.elements::<i32>(), None);
    }
}
