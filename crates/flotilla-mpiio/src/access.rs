//! One data access (a file view, a position in it, a count of a memory datatype) turned into
//! one structured request: pure logic, checked against a byte-by-byte reference in the tests.

use crate::layout::{Layout, LayoutError, Level, Nest, LEVELS_MAX};
use flotilla_client::{BatchNode, BatchSub, Piece, Shape, StrideLevel};

/// Most pieces a request may have when neither side is contiguous and both are expanded.
pub const ZIP_PIECES_MAX: usize = 1 << 22;

/// A file view: `disp` bytes, then the filetype tiled; positions count etypes.
#[derive(Clone, Debug)]
pub struct View {
    pub disp: u64,
    pub etype_size: u64,
    pub filetype: Layout,
}

impl View {
    /// The default view: displacement 0, bytes.
    pub fn bytes() -> View {
        View { disp: 0, etype_size: 1, filetype: Layout::named(1, 0, 1).expect("one byte") }
    }

    /// Checks an etype and a filetype as MPI_File_set_view requires.
    pub fn new(disp: u64, etype: &Layout, filetype: &Layout) -> Result<View, LayoutError> {
        if etype.size == 0 {
            return Err(LayoutError::Invalid("the etype has no data".into()));
        }
        if filetype.size == 0 || !filetype.size.is_multiple_of(etype.size) {
            return Err(LayoutError::Invalid(format!(
                "the filetype's size {} is not a positive multiple of the etype's size {}",
                filetype.size, etype.size
            )));
        }
        if filetype.extent <= 0 {
            return Err(LayoutError::Invalid("the filetype's extent is not positive".into()));
        }
        for nest in &filetype.nests {
            if nest.disp_bounds().0 < 0 {
                return Err(LayoutError::Invalid("the filetype has a negative displacement".into()));
            }
            if nest.levels.iter().any(|level| level.disp_stride < 0) {
                return Err(LayoutError::Invalid("the filetype's displacements decrease".into()));
            }
        }
        Ok(View { disp, etype_size: etype.size, filetype: filetype.clone() })
    }

    /// The file's nests for stream bytes `[start, start + length)` of the view, stream
    /// positions counted from `start`.
    fn file_nests(&self, start: u64, length: u64) -> Result<Vec<Nest>, LayoutError> {
        let tile = &self.filetype;
        let (size, extent) = (tile.size, tile.extent);
        let end = start + length;
        let (first, last) = (start / size, (end - 1) / size);
        let mut out = Vec::new();
        let shift = |nest: &mut Nest, index: u64| -> Result<(), LayoutError> {
            let offset = (self.disp as i64)
                .checked_add((index as i64).checked_mul(extent).ok_or_else(too_large)?)
                .ok_or_else(too_large)?;
            nest.disp = nest.disp.checked_add(offset).ok_or_else(too_large)?;
            nest.stream = nest.stream + index * size - start;
            Ok(())
        };
        let partial = |index: u64, out: &mut Vec<Nest>| -> Result<(), LayoutError> {
            let base = index * size;
            let (from, to) = (start.max(base) - base, end.min(base + size) - base);
            let mut cut = Vec::new();
            for nest in &tile.nests {
                nest.cut(from, to, &mut cut);
            }
            for mut nest in cut {
                shift(&mut nest, index)?;
                out.push(nest);
            }
            Ok(())
        };
        let full = |index: u64| index * size >= start && (index + 1) * size <= end;
        let mut low = first;
        if !full(first) {
            partial(first, &mut out)?;
            low = first + 1;
        }
        let tail = last > first && !full(last);
        let high = if tail { last - 1 } else { last };
        if low <= high && full(low) {
            for nest in &tile.nests {
                let mut nest = nest.clone();
                nest.levels.push(Level { disp_stride: extent, stream_stride: size, count: high - low + 1 });
                if nest.levels.len() > LEVELS_MAX {
                    return Err(LayoutError::TooLarge(format!("more than {LEVELS_MAX} levels")));
                }
                shift(&mut nest, low)?;
                out.push(nest.normalize());
            }
        }
        if tail {
            partial(last, &mut out)?;
        }
        crate::layout::merge_adjacent(&mut out);
        Ok(out)
    }
}

fn too_large() -> LayoutError {
    LayoutError::TooLarge("file offset overflows 64 bits".into())
}

/// One access as a request: the shape, and where the memory side starts relative to the
/// caller's buffer pointer (`memory_base`, possibly negative) and how many bytes from there it
/// spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub shape: Shape,
    pub memory_base: i64,
    pub memory_span: u64,
    pub bytes: u64,
}

/// The request moving `count` items of `memtype` at the caller's buffer to or from the view's
/// stream bytes starting at `position` etypes. `None` when it moves nothing.
pub fn plan(view: &View, position: u64, count: u64, memtype: &Layout) -> Result<Option<Access>, LayoutError> {
    let bytes = memtype.size.checked_mul(count).ok_or_else(|| LayoutError::TooLarge("count".into()))?;
    if bytes == 0 {
        return Ok(None);
    }
    if !bytes.is_multiple_of(view.etype_size) {
        return Err(LayoutError::Invalid(format!(
            "{bytes} bytes of data is not a whole number of etypes of {} bytes",
            view.etype_size
        )));
    }
    let start = position.checked_mul(view.etype_size).ok_or_else(too_large)?;
    let file = view.file_nests(start, bytes)?;
    let memory = Layout::contiguous(count as i64, memtype)?.nests;
    // Pairs of (file nests, memory nests); the side that is one run maps the other's stream
    // positions affinely.
    let pairs: Vec<(Nest, Nest)> = if let [run] = single_run(&memory) {
        file.iter().map(|f| (f.clone(), translate(f, run))).collect()
    } else if let [run] = single_run(&file) {
        memory.into_iter().map(|m| (translate(&m, run), m)).collect()
    } else {
        return zip(&file, &memory, bytes).map(Some);
    };
    Ok(Some(to_access(&pairs, bytes)?))
}

fn single_run(nests: &[Nest]) -> &[Nest] {
    if nests.len() == 1 && nests[0].levels.is_empty() {
        nests
    } else {
        &[]
    }
}

/// `other` with its displacements moved into the space of the single run `run` (whose
/// displacement at stream position `s` is `run.disp + s - run.stream`).
fn translate(other: &Nest, run: &Nest) -> Nest {
    let levels = other.levels.iter().map(|l| Level { disp_stride: l.stream_stride as i64, ..*l }).collect();
    Nest { disp: run.disp + other.stream as i64 - run.stream as i64, levels, ..other.clone() }
}

/// Builds the shape from matched (file, memory) nests of the same structure.
fn to_access(pairs: &[(Nest, Nest)], bytes: u64) -> Result<Access, LayoutError> {
    let mut low = i64::MAX;
    let mut high = i64::MIN;
    for (_, memory) in pairs {
        let (l, h) = memory.disp_bounds();
        low = low.min(l);
        high = high.max(h);
    }
    let base = low;
    let shape = match pairs {
        [(file, memory)] => {
            let file_offset = nonnegative(file.disp)?;
            let memory_offset = (memory.disp - base) as u64;
            if file.levels.is_empty() {
                Shape::Contiguous { file_offset, memory_offset, length: file.record }
            } else {
                let levels = file
                    .levels
                    .iter()
                    .zip(&memory.levels)
                    .map(|(f, m)| StrideLevel {
                        file_stride: f.disp_stride,
                        memory_stride: m.disp_stride,
                        count: f.count,
                    })
                    .collect();
                Shape::Nested { file_offset, memory_offset, record_bytes: file.record, levels }
            }
        }
        _ if pairs.iter().all(|(f, _)| f.levels.is_empty()) => Shape::List {
            pieces: pairs
                .iter()
                .map(|(f, m)| {
                    Ok(Piece {
                        file_offset: nonnegative(f.disp)?,
                        memory_offset: (m.disp - base) as u64,
                        length: f.record,
                    })
                })
                .collect::<Result<_, LayoutError>>()?,
        },
        _ => Shape::Batched {
            nodes: pairs
                .iter()
                .map(|(f, m)| {
                    nonnegative(f.disp_bounds().0)?;
                    Ok(batch_node(f, m, base))
                })
                .collect::<Result<_, LayoutError>>()?,
        },
    };
    Ok(Access { shape, memory_base: base, memory_span: (high - base) as u64, bytes })
}

fn nonnegative(disp: i64) -> Result<u64, LayoutError> {
    u64::try_from(disp).map_err(|_| LayoutError::Invalid(format!("file offset {disp} is negative")))
}

/// A root batch node (absolute offsets) for a nest pair: one node per level, outermost at the
/// root.
fn batch_node(file: &Nest, memory: &Nest, base: i64) -> BatchNode {
    let mut sub = BatchSub::Size(file.record);
    let mut node = None;
    for (f, m) in file.levels.iter().zip(&memory.levels) {
        let inner = BatchNode {
            file_offset: 0,
            memory_offset: 0,
            file_absolute: false,
            memory_absolute: false,
            count: f.count,
            file_stride: f.disp_stride,
            memory_stride: m.disp_stride,
            sub,
        };
        sub = BatchSub::Vector(vec![inner.clone()]);
        node = Some(inner);
    }
    let mut root = node.unwrap_or(BatchNode {
        file_offset: 0,
        memory_offset: 0,
        file_absolute: false,
        memory_absolute: false,
        count: 1,
        file_stride: 0,
        memory_stride: 0,
        sub,
    });
    root.file_offset = file.disp;
    root.memory_offset = memory.disp - base;
    root.file_absolute = true;
    root.memory_absolute = true;
    root
}

/// Neither side is one run: both are expanded into (stream, displacement, length) runs and
/// cut against each other into one list request.
fn zip(file: &[Nest], memory: &[Nest], bytes: u64) -> Result<Access, LayoutError> {
    let runs = |nests: &[Nest]| -> Result<Vec<(u64, i64, u64)>, LayoutError> {
        let mut out = Vec::new();
        for nest in nests {
            let mut over = false;
            nest.for_each_record(&mut |disp, stream, length| {
                if out.len() >= ZIP_PIECES_MAX {
                    over = true;
                } else {
                    out.push((stream, disp, length));
                }
            });
            if over {
                return Err(LayoutError::TooLarge(format!(
                    "both the file view and the memory type are noncontiguous and yield over {ZIP_PIECES_MAX} pieces"
                )));
            }
        }
        out.sort_unstable();
        Ok(out)
    };
    let (file, memory) = (runs(file)?, runs(memory)?);
    let base = memory.iter().map(|m| m.1).min().unwrap_or(0);
    let high = memory.iter().map(|m| m.1 + m.2 as i64).max().unwrap_or(0);
    let mut pieces = Vec::new();
    let (mut fi, mut mi, mut stream) = (0, 0, 0u64);
    while stream < bytes && fi < file.len() && mi < memory.len() {
        let (fs, fd, fl) = file[fi];
        let (ms, md, ml) = memory[mi];
        let length = (fs + fl).min(ms + ml) - stream;
        pieces.push(Piece {
            file_offset: nonnegative(fd + (stream - fs) as i64)?,
            memory_offset: (md + (stream - ms) as i64 - base) as u64,
            length,
        });
        stream += length;
        if stream == fs + fl {
            fi += 1;
        }
        if stream == ms + ml {
            mi += 1;
        }
    }
    Ok(Access { shape: Shape::List { pieces }, memory_base: base, memory_span: (high - base) as u64, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The (file offset, memory offset) of every byte the access moves, by brute force: the
    /// view's bytes in stream order from `position`, paired with the memory type's.
    fn reference(view: &View, position: u64, count: u64, memtype: &Layout) -> Vec<(u64, i64)> {
        let bytes = memtype.size * count;
        let start = position * view.etype_size;
        let file_type = crate::layout::tests::bytes(&view.filetype);
        let memory = crate::layout::tests::bytes(&Layout::contiguous(count as i64, memtype).unwrap());
        (0..bytes)
            .map(|s| {
                let t = start + s;
                let (tile, within) = (t / view.filetype.size, t % view.filetype.size);
                let file =
                    view.disp as i64 + tile as i64 * view.filetype.extent + file_type[within as usize].1;
                (file as u64, memory[s as usize].1)
            })
            .collect()
    }

    fn expand(access: &Access) -> Vec<(u64, i64)> {
        let mut out = Vec::new();
        access
            .shape
            .for_each_piece(|p: Piece| {
                for i in 0..p.length {
                    out.push((p.file_offset + i, p.memory_offset as i64 + i as i64 + access.memory_base));
                }
                Ok::<(), flotilla_request::ShapeError>(())
            })
            .unwrap();
        out
    }

    fn check(view: &View, position: u64, count: u64, memtype: &Layout) -> Access {
        let access = plan(view, position, count, memtype).unwrap().unwrap();
        let mut got = expand(&access);
        let mut expect = reference(view, position, count, memtype);
        got.sort();
        expect.sort();
        assert_eq!(got, expect);
        access
    }

    fn double() -> Layout {
        Layout::named(8, 0, 8).unwrap()
    }

    #[test]
    fn a_subarray_view_with_a_contiguous_buffer_is_one_nested_request() {
        let sub = Layout::subarray(&[8, 8, 8], &[4, 4, 4], &[0, 4, 4], true, &double()).unwrap();
        let view = View::new(100, &double(), &sub).unwrap();
        let access = check(&view, 0, 64, &double());
        assert!(matches!(access.shape, Shape::Nested { ref levels, .. } if levels.len() == 2), "{access:?}");
    }

    #[test]
    fn a_vector_view_over_several_tiles_from_mid_tile_is_checked() {
        let vec = Layout::vector(3, 2, 4, false, &double()).unwrap();
        let vec = Layout::resized(0, 12 * 8, &vec);
        let view = View::new(0, &double(), &vec).unwrap();
        check(&view, 1, 17, &double());
        check(&view, 6, 12, &double());
        check(&view, 0, 1, &double());
    }

    #[test]
    fn a_contiguous_view_with_a_strided_buffer_is_strided_on_the_memory_side() {
        let memtype = Layout::vector(4, 1, 3, false, &double()).unwrap();
        let access = check(&View::bytes(), 64, 2, &memtype);
        assert!(matches!(access.shape, Shape::Nested { .. } | Shape::Strided { .. }), "{access:?}");
    }

    #[test]
    fn both_sides_strided_zip_into_a_list() {
        let memtype = Layout::vector(4, 1, 3, false, &double()).unwrap();
        let filetype = Layout::vector(2, 3, 5, false, &Layout::named(4, 0, 4).unwrap()).unwrap();
        let view = View::new(8, &Layout::named(4, 0, 4).unwrap(), &filetype).unwrap();
        let access = check(&view, 2, 3, &memtype);
        assert!(matches!(access.shape, Shape::List { .. }));
    }

    #[test]
    fn partial_etypes_and_decreasing_filetypes_are_refused() {
        let view = View::new(0, &double(), &double()).unwrap();
        assert!(plan(&view, 0, 3, &Layout::named(4, 0, 4).unwrap()).is_err());
        let down = Layout::vector(2, 1, -2, false, &double()).unwrap();
        assert!(View::new(0, &double(), &down).is_err());
    }

    fn arb_layout() -> impl Strategy<Value = Layout> {
        let leaf = (1u64..4).prop_map(|size| Layout::named(size, 0, size as i64).unwrap());
        leaf.prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                (1i64..4, inner.clone()).prop_map(|(n, t)| Layout::contiguous(n, &t).unwrap()),
                (1i64..4, 1i64..3, 0i64..4, inner.clone()).prop_map(|(n, b, extra, t)| Layout::vector(
                    n,
                    b,
                    b + extra,
                    false,
                    &t
                )
                .unwrap()),
                (prop::collection::vec((0i64..3, 1u64..3), 1..4), inner.clone()).prop_map(|(blocks, t)| {
                    // Increasing displacements: gaps of 0..3 extents after each block.
                    let mut at = 0;
                    let blocks: Vec<(i64, u64)> = blocks
                        .into_iter()
                        .map(|(gap, n)| {
                            let disp = at;
                            at += (n as i64 + gap) * t.extent;
                            (disp, n)
                        })
                        .collect();
                    Layout::blocks(&blocks, &t).unwrap()
                }),
                (0i64..9, inner.clone()).prop_map(|(grow, t)| Layout::resized(t.lb, t.extent + grow, &t)),
                (1i64..4, 1i64..4, inner).prop_map(|(a, b, t)| {
                    Layout::subarray(&[a + 1, b + 2], &[a, b], &[1, 1], a % 2 == 0, &t).unwrap()
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn every_access_moves_exactly_the_reference_bytes(
            filetype in arb_layout(),
            memtype in arb_layout(),
            disp in 0u64..40,
            position in 0u64..40,
            count in 1u64..5,
        ) {
            let etype = Layout::named(1, 0, 1).unwrap();
            prop_assume!(filetype.size > 0 && filetype.lb >= 0 && filetype.extent > 0);
            let view = View::new(disp, &etype, &filetype).unwrap();
            let access = plan(&view, position, count, &memtype).unwrap().unwrap();
            let mut got = expand(&access);
            let mut expect = reference(&view, position, count, &memtype);
            got.sort();
            expect.sort();
            prop_assert_eq!(got, expect);
        }
    }
}
