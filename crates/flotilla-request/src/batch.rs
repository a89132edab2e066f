//! Nested-batched requests (Galley §5.3): vectors and trees of batch nodes.

use crate::error::ShapeError;
use crate::shape::{step, Count, Wide, BATCH_DEPTH_MAX};
use serde::{Deserialize, Deserializer, Serialize};
use std::cell::Cell;

/// One `gfs_batch` node: repeat `sub` `count` times with the given strides, starting at
/// an offset that is absolute or relative (see the crate docs for what it is relative to).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchNode {
    pub file_offset: i64,
    pub memory_offset: i64,
    pub file_absolute: bool,
    pub memory_absolute: bool,
    pub count: u64,
    pub file_stride: i64,
    pub memory_stride: i64,
    #[serde(deserialize_with = "deserialize_sub")]
    pub sub: BatchSub,
}

/// What a batch node repeats: a simple transfer of `Size` bytes, or a vector of nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchSub {
    Size(u64),
    Vector(Vec<BatchNode>),
}

/// Deepest nesting the decoder builds: a little over [`BATCH_DEPTH_MAX`], so that a tree the
/// validator would refuse still gets the validator's message, while a hostile frame with
/// thousands of nested vectors is refused after a few dozen levels instead of recursing once
/// per level (and overflowing the stack).
pub const BATCH_DECODE_DEPTH_MAX: usize = BATCH_DEPTH_MAX + 2;

thread_local! {
    /// Nesting level of the batch node being decoded on this thread (decoding is synchronous,
    /// so one counter per thread is exact).
    static DECODE_DEPTH: Cell<usize> = const { Cell::new(0) };
}

thread_local! {
    /// Why the last batch decode on this thread was refused (postcard keeps only "custom error").
    static DECODE_REFUSAL: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Why the batch decoder last refused input on this thread, cleared by the call.
pub fn take_decode_refusal() -> Option<String> {
    DECODE_REFUSAL.with(|r| r.borrow_mut().take())
}

/// Leaves one nesting level when dropped, also when decoding fails or unwinds.
struct DepthGuard;

impl DepthGuard {
    fn enter() -> Result<DepthGuard, usize> {
        let depth = DECODE_DEPTH.with(|d| d.get()) + 1;
        if depth > BATCH_DECODE_DEPTH_MAX {
            return Err(depth);
        }
        DECODE_DEPTH.with(|d| d.set(depth));
        Ok(DepthGuard)
    }
}

impl Drop for DepthGuard {
    fn drop(&mut self) {
        DECODE_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Decodes a node's `sub`, counting the nesting level before recursing into it.
fn deserialize_sub<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BatchSub, D::Error> {
    let _guard = DepthGuard::enter().map_err(|depth| {
        let message =
            format!("batched request nests at least {depth} deep, over the decoding limit of {BATCH_DECODE_DEPTH_MAX}");
        DECODE_REFUSAL.with(|r| *r.borrow_mut() = Some(message.clone()));
        serde::de::Error::custom(message)
    })?;
    BatchSub::deserialize(deserializer)
}

/// Pieces, bytes and walk steps of a vector of nodes, with checked arithmetic.
pub(crate) fn count_vector(nodes: &[BatchNode], depth: usize) -> Result<Count, ShapeError> {
    if depth > BATCH_DEPTH_MAX {
        return Err(ShapeError::TooDeep { depth, limit: BATCH_DEPTH_MAX });
    }
    let mut total = Count { pieces: 0, bytes: 0, steps: 0 };
    for node in nodes {
        let count = count_node(node, depth)?;
        total = total.add(&count)?;
    }
    Ok(total)
}

fn count_node(node: &BatchNode, depth: usize) -> Result<Count, ShapeError> {
    let sub = match &node.sub {
        BatchSub::Size(size) => Count { pieces: 1, bytes: u128::from(*size), steps: 0 },
        BatchSub::Vector(children) => count_vector(children, depth + 1)?,
    };
    sub.repeat(node.count)
}

/// Walks a vector whose parent is at (`parent_file`, `parent_memory`).
pub(crate) fn walk_vector(
    nodes: &[BatchNode],
    parent_file: Wide,
    parent_memory: Wide,
    depth: usize,
    visit: &mut dyn FnMut(Wide, Wide, u64) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    if depth > BATCH_DEPTH_MAX {
        return Err(ShapeError::TooDeep { depth, limit: BATCH_DEPTH_MAX });
    }
    let (mut previous_file, mut previous_memory) = (parent_file, parent_memory);
    for node in nodes {
        let file = resolve(node.file_absolute, node.file_offset, previous_file)?;
        let memory = resolve(node.memory_absolute, node.memory_offset, previous_memory)?;
        walk_node(node, file, memory, depth, visit)?;
        previous_file = file;
        previous_memory = memory;
    }
    Ok(())
}

fn resolve(absolute: bool, offset: i64, base: Wide) -> Result<Wide, ShapeError> {
    if absolute {
        Ok(Wide::from(offset))
    } else {
        base.checked_add(Wide::from(offset)).ok_or(ShapeError::Overflow { what: "batched offset" })
    }
}

fn walk_node(
    node: &BatchNode,
    file: Wide,
    memory: Wide,
    depth: usize,
    visit: &mut dyn FnMut(Wide, Wide, u64) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    for repetition in 0..node.count {
        let f = step(file, repetition, node.file_stride)?;
        let m = step(memory, repetition, node.memory_stride)?;
        match &node.sub {
            BatchSub::Size(size) => visit(f, m, *size)?,
            BatchSub::Vector(children) => walk_vector(children, f, m, depth + 1, visit)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shape;

    /// Postcard bytes of `Shape::Batched` holding one chain of `depth` nested vectors, built
    /// by hand (building the value itself would recurse as deep as the attack).
    fn nested_shape_bytes(depth: usize) -> Vec<u8> {
        // Variant 3 (Batched), one top-level node.
        let mut out = vec![3, 1];
        // file/memory offsets 0, relative, count 1, strides 0, then sub = Vector (1) of one node.
        for _ in 0..depth {
            out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 1, 1]);
        }
        // The innermost node: sub = Size (0) of 1 byte.
        out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 1]);
        out
    }

    /// Decodes on a thread with a small stack, so unbounded recursion would crash the test.
    fn decode_on_small_stack(bytes: Vec<u8>) -> Result<Shape, String> {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || postcard::from_bytes::<Shape>(&bytes).map_err(|e| e.to_string()))
            .expect("spawn decoder thread")
            .join()
            .expect("decoder thread panicked")
    }

    #[test]
    fn twenty_thousand_nested_vectors_are_refused_without_recursing() {
        let bytes = nested_shape_bytes(20_000);
        assert!(bytes.len() > 150_000, "the attack frame is about 180 KB");
        decode_on_small_stack(bytes).expect_err("a 20,000-deep tree must be refused");
        // The depth counter is back at zero: a legitimate tree decodes afterwards on this thread.
        let shape: Shape = postcard::from_bytes(&nested_shape_bytes(3)).expect("shallow tree decodes");
        assert!(matches!(shape, Shape::Batched { .. }));
    }

    #[test]
    fn trees_at_the_depth_limit_still_decode() {
        let shape = decode_on_small_stack(nested_shape_bytes(BATCH_DEPTH_MAX)).expect("limit-deep tree");
        let again = postcard::to_allocvec(&shape).expect("encode");
        assert_eq!(again, nested_shape_bytes(BATCH_DEPTH_MAX), "round trip is exact");
        assert!(decode_on_small_stack(nested_shape_bytes(BATCH_DECODE_DEPTH_MAX + 1)).is_err());
    }
}
