//! Property tests: every shape's expansion equals a naive reference expansion written
//! directly from Galley §5, including negative strides and relative batched offsets.

use flotilla_request::{BatchNode, BatchSub, Piece, Shape, ShapeError, ShapeLimits, StrideLevel};
use proptest::prelude::*;

const LIMITS: ShapeLimits = ShapeLimits { pieces_max: 1 << 16, bytes_max: 1 << 30 };

/// A reference piece with signed offsets, so the reference can say when a piece runs
/// before offset 0.
type RefPiece = (i128, i128, u64);

fn reference_nested(file: i128, memory: i128, record: u64, levels: &[StrideLevel]) -> Vec<RefPiece> {
    // Odometer over index vectors, innermost level fastest.
    let mut out = Vec::new();
    if levels.iter().any(|l| l.count == 0) {
        return out;
    }
    let mut index = vec![0u64; levels.len()];
    loop {
        let mut f = file;
        let mut m = memory;
        for (level, i) in levels.iter().zip(&index) {
            f += i128::from(*i) * i128::from(level.file_stride);
            m += i128::from(*i) * i128::from(level.memory_stride);
        }
        out.push((f, m, record));
        let mut k = 0;
        loop {
            if k == levels.len() {
                return out;
            }
            index[k] += 1;
            if index[k] < levels[k].count {
                break;
            }
            index[k] = 0;
            k += 1;
        }
    }
}

/// Batched reference: first resolve every element's start, then expand repetitions.
fn reference_batched(nodes: &[BatchNode], parent: (i128, i128), out: &mut Vec<RefPiece>) {
    let mut starts = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let base = if i == 0 { parent } else { starts[i - 1] };
        let f = if node.file_absolute {
            i128::from(node.file_offset)
        } else {
            base.0 + i128::from(node.file_offset)
        };
        let m = if node.memory_absolute {
            i128::from(node.memory_offset)
        } else {
            base.1 + i128::from(node.memory_offset)
        };
        starts.push((f, m));
    }
    for (node, start) in nodes.iter().zip(starts) {
        for r in 0..node.count {
            let at = (
                start.0 + i128::from(r) * i128::from(node.file_stride),
                start.1 + i128::from(r) * i128::from(node.memory_stride),
            );
            match &node.sub {
                BatchSub::Size(size) => out.push((at.0, at.1, *size)),
                BatchSub::Vector(children) => reference_batched(children, at, out),
            }
        }
    }
}

fn check(shape: &Shape, reference: Vec<RefPiece>) -> Result<(), TestCaseError> {
    let negative = reference.iter().position(|(f, m, _)| *f < 0 || *m < 0);
    match (shape.validate(&LIMITS), negative) {
        (Err(ShapeError::BeforeStart { index, .. }), Some(first)) => {
            prop_assert_eq!(index, first as u64);
        }
        (Ok(summary), None) => {
            let expected: Vec<Piece> = reference
                .iter()
                .map(|(f, m, l)| Piece { file_offset: *f as u64, memory_offset: *m as u64, length: *l })
                .collect();
            let pieces = shape.pieces().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&pieces, &expected);
            prop_assert_eq!(summary.piece_count, expected.len() as u64);
            let memory_end = expected.iter().map(|p| p.memory_offset + p.length).max().unwrap_or(0);
            prop_assert_eq!(summary.memory_end, memory_end);
            let file_end = expected.iter().map(|p| p.file_offset + p.length).max().unwrap_or(0);
            prop_assert_eq!(summary.file_end, file_end);
            let file_start =
                expected.iter().filter(|p| p.length > 0).map(|p| p.file_offset).min().unwrap_or(0);
            prop_assert_eq!(summary.file_start, file_start);
        }
        (outcome, negative) => {
            return Err(TestCaseError::fail(format!(
                "validate gave {outcome:?}, reference negative at {negative:?}"
            )));
        }
    }
    Ok(())
}

fn level() -> impl Strategy<Value = StrideLevel> {
    (-300i64..300, -300i64..300, 0u64..5).prop_map(|(file_stride, memory_stride, count)| StrideLevel {
        file_stride,
        memory_stride,
        count,
    })
}

fn batch_tree(depth: u32) -> BoxedStrategy<BatchNode> {
    let leaf = (0u64..40).prop_map(BatchSub::Size).boxed();
    let sub = if depth == 0 {
        leaf
    } else {
        prop_oneof![leaf, prop::collection::vec(batch_tree(depth - 1), 1..4).prop_map(BatchSub::Vector)]
            .boxed()
    };
    (-200i64..500, -200i64..500, any::<bool>(), any::<bool>(), 0u64..4, -100i64..100, -100i64..100, sub)
        .prop_map(|(file_offset, memory_offset, file_absolute, memory_absolute, count, fs, ms, sub)| {
            BatchNode {
                file_offset,
                memory_offset,
                file_absolute,
                memory_absolute,
                count,
                file_stride: fs,
                memory_stride: ms,
                sub,
            }
        })
        .boxed()
}

proptest! {
    #[test]
    fn strided_matches_reference(
        file in 0u64..2000, memory in 0u64..2000, record in 0u64..64,
        fs in -500i64..500, ms in -500i64..500, count in 0u64..40,
    ) {
        let shape = Shape::Strided { file_offset: file, memory_offset: memory, record_bytes: record,
            file_stride: fs, memory_stride: ms, count };
        let level = StrideLevel { file_stride: fs, memory_stride: ms, count };
        check(&shape, reference_nested(file.into(), memory.into(), record, &[level]))?;
    }

    /// The strided shape's own summary and walk (checked at its end records, no check per
    /// record) agree with the general walk of the same records as a one-level nested shape,
    /// errors included, also near the ends of the offset range.
    #[test]
    fn strided_run_matches_the_general_walk(
        file in prop_oneof![0u64..4000, (i64::MAX as u64 - 4000)..=(i64::MAX as u64), 0u64..=u64::MAX],
        memory in prop_oneof![0u64..4000, (i64::MAX as u64 - 4000)..=(i64::MAX as u64)],
        record in 0u64..128,
        fs in prop_oneof![-300i64..300, Just(i64::MIN), Just(i64::MAX)],
        ms in -300i64..300,
        count in 0u64..50,
    ) {
        let strided = Shape::Strided { file_offset: file, memory_offset: memory, record_bytes: record,
            file_stride: fs, memory_stride: ms, count };
        let level = StrideLevel { file_stride: fs, memory_stride: ms, count };
        let nested = Shape::Nested { file_offset: file, memory_offset: memory, record_bytes: record, levels: vec![level] };
        prop_assert_eq!(strided.validate(&LIMITS), nested.validate(&LIMITS));
        prop_assert_eq!(strided.pieces(), nested.pieces());
    }

    #[test]
    fn nested_matches_reference(
        file in 0u64..3000, memory in 0u64..3000, record in 1u64..32,
        levels in prop::collection::vec(level(), 0..4),
    ) {
        let shape = Shape::Nested { file_offset: file, memory_offset: memory, record_bytes: record, levels: levels.clone() };
        check(&shape, reference_nested(file.into(), memory.into(), record, &levels))?;
    }

    #[test]
    fn batched_matches_reference(nodes in prop::collection::vec(batch_tree(3), 0..4)) {
        let mut reference = Vec::new();
        reference_batched(&nodes, (0, 0), &mut reference);
        prop_assume!(reference.len() <= LIMITS.pieces_max as usize);
        check(&Shape::Batched { nodes }, reference)?;
    }

    #[test]
    fn list_matches_reference(pieces in prop::collection::vec((0u64..1000, 0u64..1000, 0u64..100), 0..30)) {
        let list: Vec<Piece> = pieces.iter().map(|(f, m, l)| Piece { file_offset: *f, memory_offset: *m, length: *l }).collect();
        let reference = pieces.iter().map(|(f, m, l)| (i128::from(*f), i128::from(*m), *l)).collect();
        check(&Shape::List { pieces: list }, reference)?;
    }
}

#[test]
fn huge_counts_are_refused_without_walking() {
    let shape = Shape::Strided {
        file_offset: 0,
        memory_offset: 0,
        record_bytes: 64,
        file_stride: 64,
        memory_stride: 64,
        count: 1 << 60,
    };
    assert!(matches!(shape.validate(&LIMITS), Err(ShapeError::TooManyPieces { .. })));
    let levels = vec![StrideLevel { file_stride: 1, memory_stride: 1, count: u64::MAX }; 3];
    let nested = Shape::Nested { file_offset: 0, memory_offset: 0, record_bytes: 1, levels };
    assert!(matches!(nested.validate(&LIMITS), Err(ShapeError::Overflow { .. })));
}

#[test]
fn empty_repetitions_cannot_spin() {
    // A node repeated 2^62 times whose sub-vector yields nothing must be refused, not walked.
    let empty = BatchNode {
        file_offset: 0,
        memory_offset: 0,
        file_absolute: false,
        memory_absolute: false,
        count: 0,
        file_stride: 0,
        memory_stride: 0,
        sub: BatchSub::Size(1),
    };
    let spin = BatchNode { count: 1 << 62, sub: BatchSub::Vector(vec![empty]), ..batch_leaf() };
    assert!(matches!(
        Shape::Batched { nodes: vec![spin] }.validate(&LIMITS),
        Err(ShapeError::TooManySteps { .. })
    ));
}

#[test]
fn too_many_bytes_names_the_limit() {
    let shape = Shape::contiguous(0, 2 << 30);
    let error = shape.validate(&LIMITS).unwrap_err();
    assert!(error.to_string().contains("request_bytes_max"), "{error}");
}

#[test]
fn negative_stride_before_zero_is_refused() {
    let shape = Shape::Strided {
        file_offset: 100,
        memory_offset: 0,
        record_bytes: 10,
        file_stride: -60,
        memory_stride: 10,
        count: 3,
    };
    assert!(matches!(shape.validate(&LIMITS), Err(ShapeError::BeforeStart { index: 2, side: "file", .. })));
}

fn batch_leaf() -> BatchNode {
    BatchNode {
        file_offset: 0,
        memory_offset: 0,
        file_absolute: false,
        memory_absolute: false,
        count: 1,
        file_stride: 0,
        memory_stride: 0,
        sub: BatchSub::Size(8),
    }
}
