//! MPI datatypes flattened into nested-strided runs (pure logic, no MPI and no I/O).
//!
//! A datatype's bytes, in typemap order, form a *stream*: byte `s` of the stream is the
//! `s`-th data byte of the type. A [`Layout`] describes the type as a set of [`Nest`]s, each a
//! nested-strided run that carries, for every record it yields, both its displacement and its
//! stream position. Because every record knows its stream position, the nests need not be in
//! any order, and repeating a type of several nests just adds a level to each of them (the
//! stream stride is the type's size): a vector of a struct stays as many nests as the struct
//! has blocks, however long the vector.

use std::fmt;

/// Most levels a nest may have (the request's limit, `flotilla_request::STRIDE_LEVELS_MAX`).
pub const LEVELS_MAX: usize = 32;
/// Most nests one datatype may flatten to (an indexed type of more blocks is refused).
pub const NESTS_MAX: usize = 1 << 20;
/// Most dimensions of a subarray type.
pub const DIMS_MAX: usize = 32;

/// Why a datatype cannot be flattened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// The constructor's arguments are wrong (negative count, bad order, ...).
    Invalid(String),
    /// The type is legal MPI but not supported here (darray, Fortran types, ...).
    Unsupported(String),
    /// The type is too large or too irregular for one request.
    TooLarge(String),
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::Invalid(m) => write!(f, "invalid datatype: {m}"),
            LayoutError::Unsupported(m) => write!(f, "unsupported datatype: {m}"),
            LayoutError::TooLarge(m) => write!(f, "datatype too large: {m}"),
        }
    }
}

impl std::error::Error for LayoutError {}

/// One level of a nest: repeat the inner pattern `count` times, moving `disp_stride` bytes of
/// displacement and `stream_stride` bytes of stream each time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    pub disp_stride: i64,
    pub stream_stride: u64,
    pub count: u64,
}

/// A nested-strided run: records of `record` bytes at displacement `disp` and stream
/// position `stream`, repeated by `levels` (innermost first). Within a nest, records come in
/// increasing stream order and never overlap in the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nest {
    pub disp: i64,
    pub stream: u64,
    pub record: u64,
    pub levels: Vec<Level>,
}

/// A flattened datatype: its nests, size (data bytes), lower bound and extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub nests: Vec<Nest>,
    pub size: u64,
    pub lb: i64,
    pub extent: i64,
}

/// Checked arithmetic with a message.
fn add(a: i64, b: i64) -> Result<i64, LayoutError> {
    a.checked_add(b).ok_or_else(|| LayoutError::TooLarge("displacement overflows 64 bits".into()))
}

fn mul(a: i64, b: i64) -> Result<i64, LayoutError> {
    a.checked_mul(b).ok_or_else(|| LayoutError::TooLarge("displacement overflows 64 bits".into()))
}

fn umul(a: u64, b: u64) -> Result<u64, LayoutError> {
    a.checked_mul(b).ok_or_else(|| LayoutError::TooLarge("size overflows 64 bits".into()))
}

fn count_of(value: i64, what: &str) -> Result<u64, LayoutError> {
    u64::try_from(value).map_err(|_| LayoutError::Invalid(format!("{what} {value} is negative")))
}

impl Nest {
    /// Stream bytes from the first record's start to the last record's end.
    pub fn stream_span(&self) -> u64 {
        span_of(self.record, &self.levels)
    }

    /// Data bytes the nest yields.
    pub fn bytes(&self) -> u64 {
        self.levels.iter().fold(self.record, |bytes, level| bytes.saturating_mul(level.count))
    }

    /// The lowest and one past the highest displacement the nest touches.
    pub fn disp_bounds(&self) -> (i64, i64) {
        let (mut low, mut high) = (self.disp, self.disp.saturating_add(self.record as i64));
        for level in &self.levels {
            let reach = level.disp_stride.saturating_mul(level.count.saturating_sub(1) as i64);
            if reach < 0 {
                low = low.saturating_add(reach);
            } else {
                high = high.saturating_add(reach);
            }
        }
        (low, high)
    }

    /// Merges levels that continue each other and drops levels of one repetition.
    pub(crate) fn normalize(mut self) -> Nest {
        self.levels.retain(|level| level.count != 1);
        loop {
            if let Some(first) = self.levels.first().copied() {
                let record = self.record as i64;
                if first.disp_stride == record && first.stream_stride == self.record {
                    self.record = self.record.saturating_mul(first.count);
                    self.levels.remove(0);
                    continue;
                }
            }
            break;
        }
        let mut index = 0;
        while index + 1 < self.levels.len() {
            let (inner, outer) = (self.levels[index], self.levels[index + 1]);
            if inner.disp_stride.checked_mul(inner.count as i64) == Some(outer.disp_stride)
                && inner.stream_stride.checked_mul(inner.count) == Some(outer.stream_stride)
            {
                self.levels[index].count = inner.count.saturating_mul(outer.count);
                self.levels.remove(index + 1);
            } else {
                index += 1;
            }
        }
        self
    }

    fn is_empty(&self) -> bool {
        self.record == 0 || self.levels.iter().any(|level| level.count == 0)
    }

    /// Calls `visit(disp, stream, length)` for every record, in stream order.
    pub fn for_each_record(&self, visit: &mut impl FnMut(i64, u64, u64)) {
        fn walk(nest: &Nest, depth: usize, disp: i64, stream: u64, visit: &mut impl FnMut(i64, u64, u64)) {
            if depth == 0 {
                visit(disp, stream, nest.record);
                return;
            }
            let level = nest.levels[depth - 1];
            for index in 0..level.count {
                let d = disp + level.disp_stride * index as i64;
                walk(nest, depth - 1, d, stream + level.stream_stride * index, visit);
            }
        }
        walk(self, self.levels.len(), self.disp, self.stream, visit)
    }

    /// The part of the nest that falls in stream range `[from, to)`, as nests (at most two
    /// per level plus one), appended to `out`.
    pub fn cut(&self, from: u64, to: u64, out: &mut Vec<Nest>) {
        cut_levels(self.disp, self.stream, self.record, &self.levels, from, to, out)
    }
}

fn span_of(record: u64, levels: &[Level]) -> u64 {
    levels.iter().fold(record, |span, level| {
        if level.count == 0 {
            0
        } else {
            level.stream_stride.saturating_mul(level.count - 1).saturating_add(span)
        }
    })
}

fn cut_levels(
    disp: i64,
    stream: u64,
    record: u64,
    levels: &[Level],
    from: u64,
    to: u64,
    out: &mut Vec<Nest>,
) {
    let Some((outer, inner)) = levels.split_last() else {
        let (low, high) = (stream.max(from), (stream + record).min(to));
        if low < high {
            out.push(Nest {
                disp: disp + (low - stream) as i64,
                stream: low,
                record: high - low,
                levels: vec![],
            });
        }
        return;
    };
    let span = span_of(record, inner);
    if outer.count == 0
        || span == 0
        || to <= stream
        || from >= stream + outer.stream_stride * (outer.count - 1) + span
    {
        return;
    }
    let stride = outer.stream_stride;
    // First repetition ending after `from`, last starting before `to`.
    let first = if from < stream + span { 0 } else { (from - stream - span) / stride + 1 };
    let last = ((to - 1 - stream) / stride).min(outer.count - 1);
    if first > last {
        return;
    }
    let start = |index: u64| stream + stride * index;
    let full = |index: u64| start(index) >= from && start(index) + span <= to;
    let at = |index: u64| disp + outer.disp_stride * index as i64;
    let emit_full = |low: u64, high: u64, out: &mut Vec<Nest>| {
        let mut levels = inner.to_vec();
        levels.push(Level { count: high - low + 1, ..*outer });
        out.push(Nest { disp: at(low), stream: start(low), record, levels }.normalize());
    };
    if first == last {
        if full(first) {
            emit_full(first, first, out);
        } else {
            cut_levels(at(first), start(first), record, inner, from, to, out);
        }
        return;
    }
    let mut low = first;
    if !full(first) {
        cut_levels(at(first), start(first), record, inner, from, to, out);
        low = first + 1;
    }
    let tail_partial = !full(last);
    let high = if tail_partial { last - 1 } else { last };
    if low <= high {
        emit_full(low, high, out);
    }
    if tail_partial {
        cut_levels(at(last), start(last), record, inner, from, to, out);
    }
}

impl Layout {
    /// A predefined type of `size` bytes, lower bound `lb` and `extent`: only types whose
    /// data fill their extent (every basic C and Fortran type) are supported.
    pub fn named(size: u64, lb: i64, extent: i64) -> Result<Layout, LayoutError> {
        if lb != 0 || extent != size as i64 {
            return Err(LayoutError::Unsupported(format!(
                "predefined type of size {size} with lower bound {lb} and extent {extent} (pair types such as MPI_DOUBLE_INT)"
            )));
        }
        let nests =
            if size == 0 { vec![] } else { vec![Nest { disp: 0, stream: 0, record: size, levels: vec![] }] };
        Ok(Layout { nests, size, lb: 0, extent })
    }

    /// `count` copies of `self` whose displacements move by `disp_stride` bytes.
    fn repeat(&self, count: u64, disp_stride: i64) -> Result<Vec<Nest>, LayoutError> {
        let mut nests = Vec::with_capacity(self.nests.len());
        for nest in &self.nests {
            let mut nest = nest.clone();
            nest.levels.push(Level { disp_stride, stream_stride: self.size, count });
            let nest = nest.normalize();
            if nest.levels.len() > LEVELS_MAX {
                return Err(LayoutError::TooLarge(format!("more than {LEVELS_MAX} levels of nesting")));
            }
            if !nest.is_empty() {
                nests.push(nest);
            }
        }
        Ok(nests)
    }

    /// `MPI_Type_contiguous`.
    pub fn contiguous(count: i64, old: &Layout) -> Result<Layout, LayoutError> {
        let count = count_of(count, "count")?;
        Layout::blocks(&[(0, count)], old)
    }

    /// `MPI_Type_vector` (stride in elements) or `hvector` (`stride_is_bytes`).
    pub fn vector(
        count: i64,
        blocklength: i64,
        stride: i64,
        stride_is_bytes: bool,
        old: &Layout,
    ) -> Result<Layout, LayoutError> {
        let count = count_of(count, "count")?;
        let blocklength = count_of(blocklength, "block length")?;
        let stride = if stride_is_bytes { stride } else { mul(stride, old.extent)? };
        let block = Layout::blocks(&[(0, blocklength)], old)?;
        let nests = block.repeat(count, stride)?;
        let size = umul(block.size, count)?;
        let (lb, ub) = if count == 0 {
            (0, 0)
        } else {
            let last = mul(stride, count as i64 - 1)?;
            let ub = add(block.lb, block.extent)?;
            (block.lb.min(add(block.lb, last)?), ub.max(add(ub, last)?))
        };
        Ok(Layout { nests, size, lb, extent: ub - lb })
    }

    /// Blocks of `(displacement in bytes, element count)` of one type (`indexed`, `hindexed`,
    /// `indexed_block`, `contiguous`); element counts of zero are skipped.
    pub fn blocks(blocks: &[(i64, u64)], old: &Layout) -> Result<Layout, LayoutError> {
        let typed: Vec<(i64, u64, &Layout)> =
            blocks.iter().map(|&(disp, count)| (disp, count, old)).collect();
        Layout::structure(&typed)
    }

    /// `MPI_Type_create_struct`: blocks of `(displacement in bytes, count, type)`.
    pub fn structure(blocks: &[(i64, u64, &Layout)]) -> Result<Layout, LayoutError> {
        let mut nests = Vec::new();
        let mut size = 0u64;
        let mut bounds: Option<(i64, i64)> = None;
        for &(disp, count, old) in blocks {
            if count == 0 {
                continue;
            }
            for nest in old.repeat(count, old.extent)? {
                if nests.len() >= NESTS_MAX {
                    return Err(LayoutError::TooLarge(format!("more than {NESTS_MAX} separate blocks")));
                }
                let mut nest = nest;
                nest.disp = add(nest.disp, disp)?;
                nest.stream =
                    nest.stream.checked_add(size).ok_or_else(|| LayoutError::TooLarge("size".into()))?;
                nests.push(nest);
            }
            size = size
                .checked_add(umul(old.size, count)?)
                .ok_or_else(|| LayoutError::TooLarge("size overflows 64 bits".into()))?;
            let lb = add(disp, old.lb)?;
            let ub = add(add(lb, mul(old.extent, count as i64 - 1)?)?, old.extent)?;
            bounds = Some(match bounds {
                None => (lb, ub),
                Some((l, u)) => (l.min(lb), u.max(ub)),
            });
        }
        merge_adjacent(&mut nests);
        let (lb, ub) = bounds.unwrap_or((0, 0));
        Ok(Layout { nests, size, lb, extent: ub - lb })
    }

    /// `MPI_Type_create_subarray`: `order_c` true for MPI_ORDER_C.
    pub fn subarray(
        sizes: &[i64],
        subsizes: &[i64],
        starts: &[i64],
        order_c: bool,
        old: &Layout,
    ) -> Result<Layout, LayoutError> {
        let dims = sizes.len();
        if dims == 0 || dims > DIMS_MAX || subsizes.len() != dims || starts.len() != dims {
            return Err(LayoutError::Invalid(format!("subarray of {dims} dimensions (1 to {DIMS_MAX})")));
        }
        for d in 0..dims {
            if sizes[d] < 1 || subsizes[d] < 1 || starts[d] < 0 || starts[d] + subsizes[d] > sizes[d] {
                return Err(LayoutError::Invalid(format!(
                    "subarray dimension {d}: size {}, subsize {}, start {}",
                    sizes[d], subsizes[d], starts[d]
                )));
            }
        }
        // Dimensions from the fastest-varying out.
        let order: Vec<usize> = if order_c { (0..dims).rev().collect() } else { (0..dims).collect() };
        let mut current = old.clone();
        let mut stride = old.extent;
        let mut offset = 0i64;
        for &d in &order {
            current = Layout::vector(subsizes[d], 1, stride, true, &current)?;
            offset = add(offset, mul(starts[d], stride)?)?;
            stride = mul(stride, sizes[d])?;
        }
        let mut shifted =
            Layout::blocks(&[(offset, 1)], &Layout { lb: 0, extent: current.extent, ..current })?;
        shifted.lb = old.lb;
        shifted.extent = stride;
        Ok(shifted)
    }

    /// `MPI_Type_create_resized`.
    pub fn resized(lb: i64, extent: i64, old: &Layout) -> Layout {
        Layout { lb, extent, ..old.clone() }
    }

    /// Whether the type is one run of bytes starting at displacement 0 and filling its extent.
    pub fn is_contiguous(&self) -> bool {
        self.lb == 0
            && self.extent == self.size as i64
            && match self.nests.as_slice() {
                [] => true,
                [nest] => nest.levels.is_empty() && nest.disp == 0,
                _ => false,
            }
    }
}

/// Merges nests that are single runs continuing each other in both displacement and stream.
pub(crate) fn merge_adjacent(nests: &mut Vec<Nest>) {
    let mut out: Vec<Nest> = Vec::with_capacity(nests.len());
    for nest in nests.drain(..) {
        if let Some(last) = out.last_mut() {
            if last.levels.is_empty()
                && nest.levels.is_empty()
                && last.disp + last.record as i64 == nest.disp
                && last.stream + last.record == nest.stream
            {
                last.record += nest.record;
                continue;
            }
        }
        out.push(nest);
    }
    *nests = out;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every (displacement, byte) of a layout in stream order: the reference the flattening is
    /// checked against.
    pub(crate) fn bytes(layout: &Layout) -> Vec<(u64, i64)> {
        let mut out = Vec::new();
        for nest in &layout.nests {
            nest.for_each_record(&mut |disp, stream, length| {
                for i in 0..length {
                    out.push((stream + i, disp + i as i64));
                }
            });
        }
        out.sort();
        out
    }

    fn double() -> Layout {
        Layout::named(8, 0, 8).unwrap()
    }

    #[test]
    fn a_vector_of_doubles_is_one_strided_nest() {
        let v = Layout::vector(4, 2, 5, false, &double()).unwrap();
        assert_eq!(v.nests.len(), 1);
        assert_eq!(v.nests[0].record, 16);
        assert_eq!(v.nests[0].levels, vec![Level { disp_stride: 40, stream_stride: 16, count: 4 }]);
        assert_eq!((v.size, v.lb, v.extent), (64, 0, 3 * 40 + 16));
    }

    #[test]
    fn a_3d_subarray_is_one_nest_of_two_levels() {
        let s = Layout::subarray(&[8, 8, 8], &[4, 4, 4], &[4, 0, 4], true, &double()).unwrap();
        assert_eq!(s.nests.len(), 1, "{s:?}");
        let nest = &s.nests[0];
        assert_eq!(nest.record, 32);
        assert_eq!(nest.disp, (4 * 64 + 4) * 8);
        assert_eq!(nest.levels.len(), 2);
        assert_eq!((s.size, s.lb, s.extent), (512, 0, 512 * 8));
        let expect: Vec<(u64, i64)> = (0..4i64)
            .flat_map(|z| (0..4i64).flat_map(move |y| (0..32i64).map(move |x| (z, y, x))))
            .enumerate()
            .map(|(i, (z, y, x))| (i as u64, ((z + 4) * 64 + y * 8 + 4) * 8 + x))
            .collect();
        assert_eq!(bytes(&s), expect);
    }

    #[test]
    fn a_fortran_order_subarray_runs_along_the_first_dimension() {
        let s = Layout::subarray(&[4, 3], &[2, 3], &[1, 0], false, &double()).unwrap();
        assert_eq!(s.nests.len(), 1);
        assert_eq!(s.nests[0].record, 16);
        assert_eq!(s.nests[0].levels, vec![Level { disp_stride: 32, stream_stride: 16, count: 3 }]);
    }

    #[test]
    fn a_struct_keeps_each_block_and_a_vector_of_it_adds_a_level() {
        let int = Layout::named(4, 0, 4).unwrap();
        let s = Layout::structure(&[(0, 1, &int), (8, 2, &double())]).unwrap();
        assert_eq!((s.size, s.lb, s.extent), (20, 0, 24));
        let r = Layout::resized(0, 32, &s);
        let v = Layout::contiguous(3, &r).unwrap();
        assert_eq!(v.nests.len(), 2);
        let expect: Vec<i64> = (0..3).flat_map(|i| (0..4).chain(8..24).map(move |b| i * 32 + b)).collect();
        assert_eq!(bytes(&v).into_iter().map(|(_, d)| d).collect::<Vec<_>>(), expect);
    }

    #[test]
    fn indexed_blocks_that_touch_merge() {
        let int = Layout::named(4, 0, 4).unwrap();
        let i = Layout::blocks(&[(0, 2), (8, 3)], &int).unwrap();
        assert_eq!(i.nests.len(), 1);
        assert_eq!(i.nests[0].record, 20);
    }

    #[test]
    fn pair_types_and_bad_arguments_are_refused() {
        assert!(matches!(Layout::named(12, 0, 16), Err(LayoutError::Unsupported(_))));
        assert!(matches!(Layout::contiguous(-1, &double()), Err(LayoutError::Invalid(_))));
        assert!(matches!(Layout::subarray(&[4], &[5], &[0], true, &double()), Err(LayoutError::Invalid(_))));
    }

    #[test]
    fn cutting_a_nest_keeps_exactly_the_range() {
        let s = Layout::subarray(&[6, 5, 7], &[3, 4, 5], &[1, 1, 2], true, &Layout::named(2, 0, 2).unwrap())
            .unwrap();
        let all = bytes(&s);
        for (from, to) in [(0, 120), (1, 119), (7, 8), (10, 50), (13, 97), (0, 1), (119, 120), (40, 80)] {
            let mut cut = Vec::new();
            for nest in &s.nests {
                nest.cut(from, to, &mut cut);
            }
            let got = bytes(&Layout { nests: cut, ..s.clone() });
            let expect: Vec<_> = all.iter().copied().filter(|(st, _)| *st >= from && *st < to).collect();
            assert_eq!(got, expect, "cut [{from}, {to})");
        }
    }
}
