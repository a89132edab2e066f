//! Arrays as requests: an n-dimensional array view in memory (numpy, Fortran, C) and its
//! place in a file become ONE nested-strided request, so bindings can read into and write
//! from an array's own memory without a copy or a loop.
//!
//! A view is an element size and, per dimension, a count, a memory stride and a file stride
//! (bytes, either sign, in any order: C, Fortran, sliced, transposed or reversed views all
//! fit). Element `(i0, .., ik)` lives at memory `first + Σ ij·memory_stride_j` and at file
//! offset `file_offset + Σ ij·file_stride_j`.
//!
//! Invariants of the request this module builds:
//! - memory offsets are relative to the LOWEST byte the view touches, so the caller passes a
//!   buffer that starts there and is `extent_bytes` long; `first_element_offset_bytes` says
//!   where element (0, .., 0) sits in it;
//! - it moves exactly the view's elements (dimensions of count 1 are dropped, dimensions that
//!   are contiguous in both memory and file are merged into the record, adjacent levels that
//!   continue each other are merged into one);
//! - levels are ordered by file stride, largest outermost, so pieces come in file order;
//! - a view whose file side would start before offset 0 or end past 2^63 is refused here,
//!   before any I/O, with the same errors the shape validation gives.

use crate::error::ClientError;
use flotilla_request::{Shape, ShapeError, StrideLevel, STRIDE_LEVELS_MAX};

/// One dimension of an array view: `count` elements, `memory_stride_bytes` apart in memory
/// and `file_stride_bytes` apart in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayDim {
    pub count: u64,
    pub memory_stride_bytes: i64,
    pub file_stride_bytes: i64,
}

/// The one request that moves an array view, and the memory it addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayRequest {
    /// The request; memory offsets are relative to the lowest byte the view touches.
    pub shape: Shape,
    /// Where element (0, .., 0) sits, counted from the lowest byte the view touches.
    pub first_element_offset_bytes: u64,
    /// Bytes from the lowest byte the view touches to one past the highest (0 if empty).
    pub extent_bytes: u64,
    /// Bytes the request moves (element size times element count).
    pub total_bytes: u64,
}

/// The file strides of a dense C-ordered (row-major) array of `counts` elements.
pub fn c_order_strides(element_bytes: u64, counts: &[u64]) -> Result<Vec<i64>, ClientError> {
    let mut strides = vec![0i64; counts.len()];
    let mut stride = i128::from(element_bytes);
    for (index, count) in counts.iter().enumerate().rev() {
        strides[index] = narrow(stride, "array stride")?;
        stride = stride.checked_mul(i128::from(*count)).ok_or(overflow("array size"))?;
    }
    Ok(strides)
}

/// Builds the request that moves the view `dims` (outermost first) of `element_bytes`-byte
/// elements whose element (0, .., 0) is at `file_offset` in the file.
pub fn array_request(
    file_offset: u64,
    element_bytes: u64,
    dims: &[ArrayDim],
) -> Result<ArrayRequest, ClientError> {
    if element_bytes == 0 {
        return Err(ShapeError::Empty { what: "array element" }.into());
    }
    let elements = dims.iter().try_fold(1u128, |n, d| n.checked_mul(u128::from(d.count)));
    let total_bytes = elements
        .and_then(|n| n.checked_mul(u128::from(element_bytes)))
        .and_then(|n| u64::try_from(n).ok())
        .ok_or(overflow("array byte count"))?;
    if total_bytes == 0 {
        let shape = Shape::List { pieces: Vec::new() };
        return Ok(ArrayRequest { shape, first_element_offset_bytes: 0, extent_bytes: 0, total_bytes });
    }
    let memory = span(dims, element_bytes, |d| d.memory_stride_bytes)?;
    let file = span(dims, element_bytes, |d| d.file_stride_bytes)?;
    check_file_side(file_offset, &file)?;
    let (record_bytes, levels) = merged_levels(element_bytes, dims)?;
    let memory_offset = memory.below_first;
    let shape = match levels.as_slice() {
        [] => Shape::Contiguous { file_offset, memory_offset, length: record_bytes },
        [level] => Shape::Strided {
            file_offset,
            memory_offset,
            record_bytes,
            file_stride: level.file_stride,
            memory_stride: level.memory_stride,
            count: level.count,
        },
        _ => Shape::Nested { file_offset, memory_offset, record_bytes, levels },
    };
    debug_assert!(memory.below_first + element_bytes <= memory.extent);
    Ok(ArrayRequest {
        shape,
        first_element_offset_bytes: memory.below_first,
        extent_bytes: memory.extent,
        total_bytes,
    })
}

/// How far one side of a view reaches: bytes below element (0, .., 0) and the whole extent.
struct Span {
    below_first: u64,
    above_first: u64,
    extent: u64,
}

fn span(
    dims: &[ArrayDim],
    element_bytes: u64,
    stride: impl Fn(&ArrayDim) -> i64,
) -> Result<Span, ClientError> {
    let (mut below, mut above) = (0i128, 0i128);
    for dim in dims {
        let reach =
            i128::from(dim.count - 1).checked_mul(i128::from(stride(dim))).ok_or(overflow("reach"))?;
        if reach < 0 {
            below = below.checked_sub(reach).ok_or(overflow("reach"))?;
        } else {
            above = above.checked_add(reach).ok_or(overflow("reach"))?;
        }
    }
    let extent = below.checked_add(above).and_then(|n| n.checked_add(i128::from(element_bytes)));
    let extent = extent.ok_or(overflow("array extent"))?;
    Ok(Span {
        below_first: narrow_u64(below, "array extent")?,
        above_first: narrow_u64(above, "array extent")?,
        extent: narrow_u64(extent, "array extent")?,
    })
}

/// Refuses a view whose file side starts before offset 0 or ends past the largest offset.
fn check_file_side(file_offset: u64, file: &Span) -> Result<(), ClientError> {
    let start = i128::from(file_offset) - i128::from(file.below_first);
    if start < 0 {
        return Err(ShapeError::BeforeStart { index: 0, side: "file", offset: start }.into());
    }
    let end = start + i128::from(file.extent);
    if end > i128::from(i64::MAX) {
        return Err(ShapeError::PastEnd { index: 0, side: "file", end, max: i64::MAX }.into());
    }
    debug_assert!(i128::from(file_offset) + i128::from(file.above_first) < end);
    Ok(())
}

/// The record size and the levels (innermost first) of the view, after dropping dimensions
/// of count 1, ordering by file stride and merging what is contiguous.
fn merged_levels(element_bytes: u64, dims: &[ArrayDim]) -> Result<(u64, Vec<StrideLevel>), ClientError> {
    let mut order: Vec<ArrayDim> = dims.iter().copied().filter(|d| d.count > 1).collect();
    // Outermost = largest file stride; ties keep the array's own order (stable sort).
    order.sort_by_key(|d| {
        std::cmp::Reverse((d.file_stride_bytes.unsigned_abs(), d.memory_stride_bytes.unsigned_abs()))
    });
    let mut record_bytes = element_bytes;
    while let Some(inner) = order.last() {
        let contiguous = i128::from(inner.memory_stride_bytes) == i128::from(record_bytes)
            && i128::from(inner.file_stride_bytes) == i128::from(record_bytes);
        if !contiguous {
            break;
        }
        record_bytes = record_bytes.checked_mul(inner.count).ok_or(overflow("record size"))?;
        order.pop();
    }
    let mut levels: Vec<StrideLevel> = Vec::with_capacity(order.len());
    for dim in order.iter().rev() {
        let level = StrideLevel {
            file_stride: dim.file_stride_bytes,
            memory_stride: dim.memory_stride_bytes,
            count: dim.count,
        };
        match levels.last_mut() {
            Some(inner) if continues(inner, &level) => inner.count *= level.count,
            _ => levels.push(level),
        }
    }
    if levels.len() > STRIDE_LEVELS_MAX {
        return Err(ShapeError::TooManyLevels { levels: levels.len(), limit: STRIDE_LEVELS_MAX }.into());
    }
    Ok((record_bytes, levels))
}

/// Whether `outer` just repeats `inner` one more time per step (so the two are one level).
fn continues(inner: &StrideLevel, outer: &StrideLevel) -> bool {
    let count = i128::from(inner.count);
    let same_file = i128::from(outer.file_stride) == i128::from(inner.file_stride) * count;
    let same_memory = i128::from(outer.memory_stride) == i128::from(inner.memory_stride) * count;
    same_file && same_memory && inner.count.checked_mul(outer.count).is_some()
}

fn overflow(what: &'static str) -> ClientError {
    ShapeError::Overflow { what }.into()
}

fn narrow(value: i128, what: &'static str) -> Result<i64, ClientError> {
    i64::try_from(value).map_err(|_| overflow(what))
}

fn narrow_u64(value: i128, what: &'static str) -> Result<u64, ClientError> {
    u64::try_from(value).map_err(|_| overflow(what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A small deterministic generator (xorshift64*), enough for shuffling test views.
    struct Random(u64);

    impl Random {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// memory byte -> file byte, by walking every element of the view directly.
    fn expected(file_offset: u64, element: u64, dims: &[ArrayDim], first: u64) -> BTreeMap<i128, i128> {
        let mut map = BTreeMap::new();
        let total: u64 = dims.iter().map(|d| d.count).product();
        for mut linear in 0..total {
            let (mut memory, mut file) = (i128::from(first), i128::from(file_offset));
            for dim in dims.iter().rev() {
                let index = i128::from(linear % dim.count);
                linear /= dim.count;
                memory += index * i128::from(dim.memory_stride_bytes);
                file += index * i128::from(dim.file_stride_bytes);
            }
            for byte in 0..i128::from(element) {
                map.insert(memory + byte, file + byte);
            }
        }
        map
    }

    fn actual(request: &ArrayRequest) -> BTreeMap<i128, i128> {
        let mut map = BTreeMap::new();
        for piece in request.shape.pieces().unwrap() {
            assert!(piece.memory_offset + piece.length <= request.extent_bytes);
            for byte in 0..piece.length {
                map.insert(i128::from(piece.memory_offset + byte), i128::from(piece.file_offset + byte));
            }
        }
        map
    }

    #[test]
    fn row_major_column_block_is_one_strided_request() {
        // 256 columns of a 4096 x 4096 float64 matrix, into a dense 4096 x 256 array.
        let dims = [
            ArrayDim { count: 4096, memory_stride_bytes: 2048, file_stride_bytes: 32768 },
            ArrayDim { count: 256, memory_stride_bytes: 8, file_stride_bytes: 8 },
        ];
        let request = array_request(8 * 100, 8, &dims).unwrap();
        let expected = Shape::Strided {
            file_offset: 800,
            memory_offset: 0,
            record_bytes: 2048,
            file_stride: 32768,
            memory_stride: 2048,
            count: 4096,
        };
        assert_eq!(request.shape, expected);
        assert_eq!(request.extent_bytes, 4096 * 2048);
    }

    #[test]
    fn dense_array_is_one_contiguous_request() {
        let dims = [
            ArrayDim { count: 3, memory_stride_bytes: 40, file_stride_bytes: 40 },
            ArrayDim { count: 5, memory_stride_bytes: 8, file_stride_bytes: 8 },
        ];
        let request = array_request(16, 8, &dims).unwrap();
        assert_eq!(request.shape, Shape::Contiguous { file_offset: 16, memory_offset: 0, length: 120 });
    }

    #[test]
    fn reversed_view_addresses_from_its_lowest_byte() {
        let dims = [ArrayDim { count: 4, memory_stride_bytes: -8, file_stride_bytes: 8 }];
        let request = array_request(0, 8, &dims).unwrap();
        assert_eq!(request.first_element_offset_bytes, 24);
        assert_eq!(request.extent_bytes, 32);
        let pieces = request.shape.pieces().unwrap();
        assert_eq!(pieces[0].memory_offset, 24);
        assert_eq!(pieces[3].memory_offset, 0);
        assert_eq!(pieces[3].file_offset, 24);
    }

    #[test]
    fn file_side_before_offset_zero_is_refused() {
        let dims = [ArrayDim { count: 4, memory_stride_bytes: 8, file_stride_bytes: -8 }];
        assert!(matches!(
            array_request(16, 8, &dims),
            Err(ClientError::Shape(ShapeError::BeforeStart { side: "file", .. }))
        ));
        assert!(array_request(24, 8, &dims).is_ok());
    }

    #[test]
    fn overflowing_views_are_refused_not_wrapped() {
        let dims = [
            ArrayDim { count: u64::MAX, memory_stride_bytes: i64::MAX, file_stride_bytes: 8 },
            ArrayDim { count: u64::MAX, memory_stride_bytes: 8, file_stride_bytes: i64::MAX },
        ];
        assert!(matches!(array_request(0, 8, &dims), Err(ClientError::Shape(ShapeError::Overflow { .. }))));
        assert!(array_request(0, 0, &[]).is_err());
        assert!(c_order_strides(8, &[u64::MAX, u64::MAX]).is_err());
    }

    #[test]
    fn empty_views_move_nothing() {
        let dims = [ArrayDim { count: 0, memory_stride_bytes: 8, file_stride_bytes: 8 }];
        let request = array_request(0, 8, &dims).unwrap();
        assert_eq!((request.total_bytes, request.extent_bytes), (0, 0));
    }

    /// Strides of a padded block laid out in a random dimension order, some reversed: every
    /// element gets its own bytes, as in any array numpy can make writable.
    fn random_strides(random: &mut Random, element: u64, counts: &[u64]) -> Vec<i64> {
        let mut order: Vec<usize> = (0..counts.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, random.below(i as u64 + 1) as usize);
        }
        let mut strides = vec![0i64; counts.len()];
        let mut step = element;
        for &dim in order.iter().rev() {
            let sign = if random.below(3) == 0 { -1 } else { 1 };
            strides[dim] = sign * step as i64;
            step = step * counts[dim] + random.below(2) * element;
        }
        strides
    }

    #[test]
    fn random_views_move_exactly_their_elements() {
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let rank = 1 + random.below(4) as usize;
            let element = [1u64, 2, 4, 8, 16][random.below(5) as usize];
            let counts: Vec<u64> = (0..rank).map(|_| 1 + random.below(4)).collect();
            let memory_strides = random_strides(&mut random, element, &counts);
            let file_strides = random_strides(&mut random, element, &counts);
            let mut dims: Vec<ArrayDim> = (0..rank)
                .map(|i| ArrayDim {
                    count: counts[i],
                    memory_stride_bytes: memory_strides[i],
                    file_stride_bytes: file_strides[i],
                })
                .collect();
            for i in (1..rank).rev() {
                dims.swap(i, random.below(i as u64 + 1) as usize);
            }
            let file_offset = 1 << 20;
            let request = array_request(file_offset, element, &dims).unwrap();
            let want = expected(file_offset, element, &dims, request.first_element_offset_bytes);
            assert_eq!(actual(&request), want, "dims {dims:?} element {element}");
            assert_eq!(request.total_bytes, element * counts.iter().product::<u64>());
        }
    }
}
