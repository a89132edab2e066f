//! Request shapes from C: one flat `flotilla_request` struct whose `kind` says which fields
//! count, turned into the client library's `Shape` after every pointer and count is checked.

use crate::error::Failure;
use flotilla_client::{BatchNode, BatchSub, Piece, Shape, StrideLevel};

/// `length` bytes at `file_offset`, to or from `memory_offset`.
pub const FLOTILLA_SHAPE_CONTIGUOUS: u32 = 0;
/// `count` records of `length` bytes; offsets move by `file_stride` / `memory_stride`.
pub const FLOTILLA_SHAPE_STRIDED: u32 = 1;
/// Records of `length` bytes repeated by `levels` (innermost first).
pub const FLOTILLA_SHAPE_NESTED: u32 = 2;
/// A vector of `node_count` batch trees at `nodes`.
pub const FLOTILLA_SHAPE_BATCHED: u32 = 3;
/// `piece_count` explicit pieces at `pieces`.
pub const FLOTILLA_SHAPE_LIST: u32 = 4;

/// Most levels of a nested request.
pub const FLOTILLA_STRIDE_LEVELS_MAX: usize = 32;
/// Most pieces of a list request passed from C.
pub const FLOTILLA_LIST_PIECES_MAX: usize = 1 << 24;
/// Most nodes, over all depths, of a batched request passed from C.
pub const FLOTILLA_BATCH_NODES_MAX: usize = 1 << 20;
/// Deepest a batched request may nest.
pub const FLOTILLA_BATCH_DEPTH_MAX: usize = 32;

/// One level of a nested request: repeat the inner pattern `count` times.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flotilla_stride_level {
    pub file_stride: i64,
    pub memory_stride: i64,
    pub count: u64,
}

/// One piece of a list request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flotilla_piece {
    pub file_offset: u64,
    pub memory_offset: u64,
    pub length: u64,
}

/// One node of a batched request (Galley's gfs_batch): repeat `count` times, moving
/// `file_stride` / `memory_stride` bytes each time, either a simple transfer of `size` bytes
/// (`children` NULL) or the vector of `child_count` nodes at `children`. Offsets are relative
/// to the previous sibling (or the parent) unless `file_absolute` / `memory_absolute` is
/// nonzero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flotilla_batch_node {
    pub file_offset: i64,
    pub memory_offset: i64,
    pub file_absolute: u8,
    pub memory_absolute: u8,
    pub count: u64,
    pub file_stride: i64,
    pub memory_stride: i64,
    pub size: u64,
    pub children: *const flotilla_batch_node,
    pub child_count: usize,
}

/// A request: `kind` (FLOTILLA_SHAPE_*) says which fields count; the others are ignored.
/// Memory offsets index the caller's buffer. Zero-initialize and set what you need:
/// `flotilla_request r = { .kind = FLOTILLA_SHAPE_STRIDED, .file_offset = 0, .length = 64,
/// .file_stride = 256, .memory_stride = 64, .count = 1024 };`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flotilla_request {
    pub kind: u32,
    /// Contiguous, strided, nested: where the first record is in the file and the buffer.
    pub file_offset: u64,
    pub memory_offset: u64,
    /// Contiguous: bytes to move. Strided, nested: bytes per record.
    pub length: u64,
    /// Strided: strides (either may be negative) and record count.
    pub file_stride: i64,
    pub memory_stride: i64,
    pub count: u64,
    /// Nested: `level_count` levels, innermost first.
    pub levels: *const flotilla_stride_level,
    pub level_count: usize,
    /// Batched: `node_count` root nodes.
    pub nodes: *const flotilla_batch_node,
    pub node_count: usize,
    /// List: `piece_count` pieces.
    pub pieces: *const flotilla_piece,
    pub piece_count: usize,
}

/// A C array as a slice, after checking NULL and the count limit.
///
/// # Safety
/// `items` is NULL (only with `count` 0) or points to `count` valid items for the call.
unsafe fn c_array<'a, T>(items: *const T, count: usize, max: usize, what: &str) -> Result<&'a [T], Failure> {
    if count > max {
        return Err(Failure::invalid(format!("{what}: {count} entries, over the limit of {max}")));
    }
    if count == 0 {
        return Ok(&[]);
    }
    if items.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL but its count is {count}")));
    }
    // SAFETY: non-NULL, and the caller's contract says `count` items are valid.
    Ok(unsafe { std::slice::from_raw_parts(items, count) })
}

/// Converts a C request into a shape.
///
/// # Safety
/// The request's pointers are valid for their counts (and batch trees for theirs) during
/// the call.
pub unsafe fn to_shape(request: &flotilla_request) -> Result<Shape, Failure> {
    let r = request;
    match r.kind {
        FLOTILLA_SHAPE_CONTIGUOUS => Ok(Shape::Contiguous {
            file_offset: r.file_offset,
            memory_offset: r.memory_offset,
            length: r.length,
        }),
        FLOTILLA_SHAPE_STRIDED => Ok(Shape::Strided {
            file_offset: r.file_offset,
            memory_offset: r.memory_offset,
            record_bytes: r.length,
            file_stride: r.file_stride,
            memory_stride: r.memory_stride,
            count: r.count,
        }),
        FLOTILLA_SHAPE_NESTED => {
            // SAFETY: the caller's contract for `levels`.
            let levels = unsafe { c_array(r.levels, r.level_count, FLOTILLA_STRIDE_LEVELS_MAX, "levels")? };
            let levels = levels
                .iter()
                .map(|l| StrideLevel {
                    file_stride: l.file_stride,
                    memory_stride: l.memory_stride,
                    count: l.count,
                })
                .collect();
            Ok(Shape::Nested {
                file_offset: r.file_offset,
                memory_offset: r.memory_offset,
                record_bytes: r.length,
                levels,
            })
        }
        FLOTILLA_SHAPE_BATCHED => {
            let mut budget = FLOTILLA_BATCH_NODES_MAX;
            // SAFETY: the caller's contract for `nodes` and their trees.
            let nodes = unsafe { batch_vector(r.nodes, r.node_count, 1, &mut budget)? };
            Ok(Shape::Batched { nodes })
        }
        FLOTILLA_SHAPE_LIST => {
            // SAFETY: the caller's contract for `pieces`.
            let pieces = unsafe { c_array(r.pieces, r.piece_count, FLOTILLA_LIST_PIECES_MAX, "pieces")? };
            let pieces = pieces
                .iter()
                .map(|p| Piece {
                    file_offset: p.file_offset,
                    memory_offset: p.memory_offset,
                    length: p.length,
                })
                .collect();
            Ok(Shape::List { pieces })
        }
        other => Err(Failure::invalid(format!("unknown request kind {other} (use FLOTILLA_SHAPE_*)"))),
    }
}

/// Copies a vector of batch nodes, bounding depth and the total node count (so that a
/// cyclic or huge tree from C costs an error, not a crash).
///
/// # Safety
/// `nodes` points to `count` valid nodes whose `children` are valid for their counts.
unsafe fn batch_vector(
    nodes: *const flotilla_batch_node,
    count: usize,
    depth: usize,
    budget: &mut usize,
) -> Result<Vec<BatchNode>, Failure> {
    if depth > FLOTILLA_BATCH_DEPTH_MAX {
        return Err(Failure::invalid(format!(
            "batched request nests deeper than {FLOTILLA_BATCH_DEPTH_MAX}"
        )));
    }
    if count > *budget {
        return Err(Failure::invalid(format!(
            "batched request has more than {FLOTILLA_BATCH_NODES_MAX} nodes"
        )));
    }
    *budget -= count;
    // SAFETY: the caller's contract.
    let nodes = unsafe { c_array(nodes, count, FLOTILLA_BATCH_NODES_MAX, "batch nodes")? };
    let mut out = Vec::with_capacity(nodes.len());
    for node in nodes {
        let sub = if node.children.is_null() {
            BatchSub::Size(node.size)
        } else {
            // SAFETY: the caller's contract covers every node of the tree.
            BatchSub::Vector(unsafe { batch_vector(node.children, node.child_count, depth + 1, budget)? })
        };
        out.push(BatchNode {
            file_offset: node.file_offset,
            memory_offset: node.memory_offset,
            file_absolute: node.file_absolute != 0,
            memory_absolute: node.memory_absolute != 0,
            count: node.count,
            file_stride: node.file_stride,
            memory_stride: node.memory_stride,
            sub,
        });
    }
    Ok(out)
}

/// The request behind a C pointer, as a shape.
///
/// # Safety
/// `request` is NULL (refused) or valid, with valid pointers, during the call.
pub unsafe fn request_shape(request: *const flotilla_request) -> Result<Shape, Failure> {
    // SAFETY: the caller's contract.
    let request = unsafe { request.as_ref() }.ok_or_else(|| Failure::invalid("request is NULL"))?;
    // SAFETY: the caller's contract.
    unsafe { to_shape(request) }
}
