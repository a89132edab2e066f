//! Request shapes as Python objects: `Shape.contiguous`, `.strided`, `.nested`, `.batched`
//! and `.list` build the one request type of the client library (Galley §5).

use crate::errors::invalid;
use flotilla_client::{BatchNode, BatchSub, Piece, Shape, StrideLevel};
use flotilla_request::ShapeLimits;
use pyo3::prelude::*;

/// Most pieces `Shape.pieces()` lists (it is for inspecting small shapes).
const LISTED_PIECES_MAX: u64 = 1 << 20;
/// Most pieces one shape may expand to (the client library's limit per call).
const SHAPE_PIECES_MAX: u64 = 1 << 30;

/// A structured request: which bytes of a file or fork, to or from which buffer offsets.
#[pyclass(frozen, name = "Shape", module = "flotilla._native")]
#[derive(Clone)]
pub struct PyShape {
    pub shape: Shape,
}

#[pymethods]
impl PyShape {
    /// `length` bytes at `file_offset`, to or from `memory_offset` in the buffer.
    #[staticmethod]
    #[pyo3(signature = (file_offset, length, memory_offset = 0))]
    fn contiguous(file_offset: u64, length: u64, memory_offset: u64) -> PyShape {
        PyShape { shape: Shape::Contiguous { file_offset, memory_offset, length } }
    }

    /// `count` records of `record_bytes`, `file_stride` bytes apart in the file and
    /// `memory_stride` bytes apart in the buffer (default: packed). Strides may be negative.
    #[staticmethod]
    #[pyo3(signature = (file_offset, record_bytes, file_stride, count, memory_stride = None, memory_offset = 0))]
    fn strided(
        py: Python<'_>,
        file_offset: u64,
        record_bytes: u64,
        file_stride: i64,
        count: u64,
        memory_stride: Option<i64>,
        memory_offset: u64,
    ) -> PyResult<PyShape> {
        let memory_stride = match memory_stride {
            Some(stride) => stride,
            None => i64::try_from(record_bytes).map_err(|_| invalid(py, "record_bytes is too large"))?,
        };
        Ok(PyShape {
            shape: Shape::Strided {
                file_offset,
                memory_offset,
                record_bytes,
                file_stride,
                memory_stride,
                count,
            },
        })
    }

    /// Records of `record_bytes` repeated by `levels`: a sequence of
    /// `(file_stride, memory_stride, count)`, innermost level first.
    #[staticmethod]
    #[pyo3(signature = (file_offset, record_bytes, levels, memory_offset = 0))]
    fn nested(
        file_offset: u64,
        record_bytes: u64,
        levels: Vec<(i64, i64, u64)>,
        memory_offset: u64,
    ) -> PyShape {
        let levels = levels
            .into_iter()
            .map(|(file_stride, memory_stride, count)| StrideLevel { file_stride, memory_stride, count })
            .collect();
        PyShape { shape: Shape::Nested { file_offset, memory_offset, record_bytes, levels } }
    }

    /// A vector of batch trees (Galley §5.3), each a `BatchNode`.
    #[staticmethod]
    fn batched(nodes: Vec<PyRef<'_, PyBatchNode>>) -> PyShape {
        PyShape { shape: Shape::Batched { nodes: nodes.iter().map(|n| n.node.clone()).collect() } }
    }

    /// Explicit pieces: a sequence of `(file_offset, memory_offset, length)`.
    #[staticmethod]
    fn list(pieces: Vec<(u64, u64, u64)>) -> PyShape {
        let pieces = pieces
            .into_iter()
            .map(|(file_offset, memory_offset, length)| Piece { file_offset, memory_offset, length })
            .collect();
        PyShape { shape: Shape::List { pieces } }
    }

    /// `"contiguous"`, `"strided"`, `"nested"`, `"batched"` or `"list"`.
    #[getter]
    fn kind(&self) -> &'static str {
        match &self.shape {
            Shape::Contiguous { .. } => "contiguous",
            Shape::Strided { .. } => "strided",
            Shape::Nested { .. } => "nested",
            Shape::Batched { .. } => "batched",
            Shape::List { .. } => "list",
        }
    }

    /// Validates the shape: `(piece_count, total_bytes, file_end, memory_end)`, where
    /// `memory_end` is the smallest buffer it fits. Raises `InvalidRequestError` (a
    /// `ValueError`) for overflowing shapes or pieces before offset 0.
    fn summary(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64)> {
        let limits = ShapeLimits { pieces_max: SHAPE_PIECES_MAX, bytes_max: u64::MAX };
        let summary = self.shape.validate(&limits).map_err(|e| invalid(py, e.to_string()))?;
        Ok((summary.piece_count, summary.total_bytes, summary.file_end, summary.memory_end))
    }

    /// Every piece as `(file_offset, memory_offset, length)`, in request order (at most
    /// 2^20 pieces).
    fn pieces(&self, py: Python<'_>) -> PyResult<Vec<(u64, u64, u64)>> {
        let limits = ShapeLimits { pieces_max: LISTED_PIECES_MAX, bytes_max: u64::MAX };
        self.shape.validate(&limits).map_err(|e| invalid(py, e.to_string()))?;
        let pieces = self.shape.pieces().map_err(|e| invalid(py, e.to_string()))?;
        Ok(pieces.into_iter().map(|p| (p.file_offset, p.memory_offset, p.length)).collect())
    }

    fn __repr__(&self) -> String {
        format!("Shape({:?})", self.shape)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyShape>().map(|o| o.get().shape == self.shape).unwrap_or(false)
    }
}

/// One node of a batched request: repeat `sub` `count` times, moving `file_stride` and
/// `memory_stride` bytes each time. `sub` is a size in bytes (a simple transfer) or a list
/// of `BatchNode`s. Offsets are relative to the previous sibling (or the parent) unless the
/// matching `*_absolute` flag is set.
#[pyclass(frozen, name = "BatchNode", module = "flotilla._native")]
#[derive(Clone)]
pub struct PyBatchNode {
    pub node: BatchNode,
}

#[pymethods]
impl PyBatchNode {
    #[new]
    #[pyo3(signature = (count, file_stride, memory_stride, sub, file_offset = 0, memory_offset = 0, file_absolute = false, memory_absolute = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        count: u64,
        file_stride: i64,
        memory_stride: i64,
        sub: &Bound<'_, PyAny>,
        file_offset: i64,
        memory_offset: i64,
        file_absolute: bool,
        memory_absolute: bool,
    ) -> PyResult<PyBatchNode> {
        let sub = if let Ok(size) = sub.extract::<u64>() {
            BatchSub::Size(size)
        } else if let Ok(children) = sub.extract::<Vec<PyRef<'_, PyBatchNode>>>() {
            BatchSub::Vector(children.iter().map(|c| c.node.clone()).collect())
        } else {
            return Err(invalid(py, "sub must be a size in bytes (int >= 0) or a list of BatchNode"));
        };
        Ok(PyBatchNode {
            node: BatchNode {
                file_offset,
                memory_offset,
                file_absolute,
                memory_absolute,
                count,
                file_stride,
                memory_stride,
                sub,
            },
        })
    }

    fn __repr__(&self) -> String {
        format!("BatchNode({:?})", self.node)
    }
}
