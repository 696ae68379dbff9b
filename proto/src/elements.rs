//! A tensor's elements read back as numbers: its bytes are little-endian values of its dtype.

use crate::v1::Dtype;

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

/// The elements of `data`, little-endian values of `dtype`, as `T`; `None` when `dtype` is not
/// `T`'s or `data` is not a whole number of elements.
pub fn elements<T: Element>(dtype: Dtype, data: &[u8]) -> Option<Vec<T>> {
    if dtype != T::DTYPE || data.len() % T::BYTES != 0 {
        return None;
    }
    Some(data.chunks_exact(T::BYTES).map(T::from_le).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_read_little_endian_in_the_dtype() {
        let ints: Vec<u8> = [-2i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(elements::<i64>(Dtype::Int64, &ints), Some(vec![-2, 7]));
        let floats = 1.5f32.to_le_bytes();
        assert_eq!(elements::<f32>(Dtype::Float32, &floats), Some(vec![1.5]));
        let tokens = [1, 2, 3, 4];
        assert_eq!(
            elements::<u16>(Dtype::Uint16, &tokens),
            Some(vec![0x0201, 0x0403])
        );
    }

    #[test]
    fn another_dtype_or_a_cut_element_is_none() {
        assert_eq!(elements::<f32>(Dtype::Int64, &[0; 16]), None);
        assert_eq!(elements::<i32>(Dtype::Int64, &[0; 16]), None);
        assert_eq!(elements::<i32>(Dtype::Int32, &[0; 6]), None);
    }
}
