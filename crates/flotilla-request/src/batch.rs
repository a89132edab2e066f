//! Nested-batched requests (Galley §5.3): vectors and trees of batch nodes.

use crate::error::ShapeError;
use crate::shape::{step, Count, Wide, BATCH_DEPTH_MAX};
use serde::{Deserialize, Serialize};

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
    pub sub: BatchSub,
}

/// What a batch node repeats: a simple transfer of `Size` bytes, or a vector of nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchSub {
    Size(u64),
    Vector(Vec<BatchNode>),
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
