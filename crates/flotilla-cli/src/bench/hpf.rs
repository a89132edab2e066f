//! The ENWRICH paper's HPF write patterns (§4, after Kotz's disk-directed I/O paper): one
//! 2-D array of `order` × `order` records, row-major in the file, distributed over the
//! processes NONE, BLOCK or CYCLIC in each dimension. `wXY` names the row (X) and column (Y)
//! distributions: `wnn` maps the whole array to process 0; `wbn`/`wcn` split rows over all
//! processes, `wnb`/`wnc` columns; `wbb`, `wcc`, `wbc`, `wcb` use a process grid as square
//! as the count allows. Each process writes its records in row-major order, one write per
//! record. Pure: no I/O.

/// How one dimension is spread over the processes along it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    None,
    Block,
    Cyclic,
}

impl Dist {
    fn letter(self) -> char {
        match self {
            Dist::None => 'n',
            Dist::Block => 'b',
            Dist::Cyclic => 'c',
        }
    }

    /// The process (along this dimension, of `count`) holding index `i` of `order`.
    fn owner(self, i: u64, order: u64, count: u64) -> u64 {
        match self {
            Dist::None => 0,
            Dist::Block => i / order.div_ceil(count),
            Dist::Cyclic => i % count,
        }
    }
}

/// A single-array write pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    pub rows: Dist,
    pub columns: Dist,
}

/// The patterns `flotilla bench paper enwrich` runs.
pub const PATTERNS: [Pattern; 7] = [
    Pattern { rows: Dist::None, columns: Dist::None },
    Pattern { rows: Dist::Block, columns: Dist::Block },
    Pattern { rows: Dist::Cyclic, columns: Dist::Cyclic },
    Pattern { rows: Dist::Block, columns: Dist::Cyclic },
    Pattern { rows: Dist::Cyclic, columns: Dist::None },
    Pattern { rows: Dist::None, columns: Dist::Cyclic },
    Pattern { rows: Dist::Block, columns: Dist::None },
];

impl Pattern {
    pub fn name(self) -> String {
        format!("w{}{}", self.rows.letter(), self.columns.letter())
    }

    /// Processes along rows and along columns, for `processes` in all.
    fn grid(self, processes: u64) -> (u64, u64) {
        match (self.rows, self.columns) {
            (Dist::None, Dist::None) => (1, 1),
            (_, Dist::None) => (processes, 1),
            (Dist::None, _) => (1, processes),
            _ => {
                let rows = (1..=processes)
                    .filter(|d| processes.is_multiple_of(*d) && d * d <= processes)
                    .max()
                    .unwrap_or(1);
                (rows, processes / rows)
            }
        }
    }

    /// The process (of `processes`) that writes record (`row`, `column`).
    pub fn owner(self, row: u64, column: u64, order: u64, processes: u64) -> u64 {
        let (along_rows, along_columns) = self.grid(processes);
        self.rows.owner(row, order, along_rows) * along_columns
            + self.columns.owner(column, order, along_columns)
    }

    /// The records process `process` writes, in its order, as row-major record indexes.
    pub fn records(self, order: u64, processes: u64, process: u64) -> Vec<u64> {
        (0..order * order).filter(|r| self.owner(r / order, r % order, order, processes) == process).collect()
    }
}

/// One array, or two arrays in two files (the paper's `wr…` and `wp…` patterns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    One(Pattern),
    /// Every process writes its records of both arrays, alternating (`wrXYZW`).
    RoundRobin(Pattern, Pattern),
    /// The first half of the processes writes the first array, the rest the second (`wpXYZW`).
    Partition(Pattern, Pattern),
    /// `wss` (Write Synchronous Sequential, §4): NONE-CYCLIC, every process writing its k-th
    /// record only after every process has written its (k-1)-th (the writers keep the rounds).
    Synchronous,
}

/// `wss`'s array layout: NONE-CYCLIC.
const WSS_PATTERN: Pattern = Pattern { rows: Dist::None, columns: Dist::Cyclic };

const fn pattern(rows: Dist, columns: Dist) -> Pattern {
    Pattern { rows, columns }
}

/// The two-array workloads `flotilla bench paper enwrich` runs: the paper's (§4) round-robin
/// `wrnnbb`, `wrnncc`, `wrnbbn`, `wrbccb` and partitioned `wpnnbb`, `wpnncc`, `wpnbbn`,
/// `wpbccb`.
pub const TWO_ARRAYS: [Workload; 8] = {
    use Dist::{Block as B, Cyclic as C, None as N};
    [
        Workload::RoundRobin(pattern(N, N), pattern(B, B)),
        Workload::Partition(pattern(N, N), pattern(C, C)),
        Workload::RoundRobin(pattern(N, N), pattern(C, C)),
        Workload::RoundRobin(pattern(N, B), pattern(B, N)),
        Workload::RoundRobin(pattern(B, C), pattern(C, B)),
        Workload::Partition(pattern(N, N), pattern(B, B)),
        Workload::Partition(pattern(N, B), pattern(B, N)),
        Workload::Partition(pattern(B, C), pattern(C, B)),
    ]
};

impl Workload {
    pub fn name(self) -> String {
        let tail = |a: Pattern, b: Pattern| format!("{}{}", &a.name()[1..], &b.name()[1..]);
        match self {
            Workload::One(p) => p.name(),
            Workload::RoundRobin(a, b) => format!("wr{}", tail(a, b)),
            Workload::Partition(a, b) => format!("wp{}", tail(a, b)),
            Workload::Synchronous => "wss".to_string(),
        }
    }

    pub fn arrays(self) -> usize {
        match self {
            Workload::One(_) | Workload::Synchronous => 1,
            _ => 2,
        }
    }

    /// The processes (of `processes`) that write array `array`, in the array's own
    /// numbering: (first process, count).
    pub fn writers(self, array: usize, processes: u64) -> (u64, u64) {
        let half = processes / 2;
        match (self, array) {
            (Workload::Partition(..), 0) => (0, half),
            (Workload::Partition(..), _) => (half, processes - half),
            _ => (0, processes),
        }
    }

    /// Whether the processes write in lock-step rounds (one record each per round).
    pub fn synchronous(self) -> bool {
        self == Workload::Synchronous
    }

    /// Rounds of a synchronous workload: the most records any process writes.
    pub fn rounds(self, order: u64, processes: u64) -> usize {
        (0..processes).map(|p| self.writes(order, processes, p).len()).max().unwrap_or(0)
    }

    /// Process `process`'s writes, in its order: (array, record index in that array).
    pub fn writes(self, order: u64, processes: u64, process: u64) -> Vec<(usize, u64)> {
        let tag = |array: usize, records: Vec<u64>| records.into_iter().map(move |r| (array, r));
        match self {
            Workload::One(p) => tag(0, p.records(order, processes, process)).collect(),
            Workload::Synchronous => tag(0, WSS_PATTERN.records(order, processes, process)).collect(),
            Workload::RoundRobin(a, b) => {
                let (mut a, mut b) = (
                    tag(0, a.records(order, processes, process)),
                    tag(1, b.records(order, processes, process)),
                );
                let mut out = Vec::new();
                loop {
                    let (x, y) = (a.next(), b.next());
                    if x.is_none() && y.is_none() {
                        return out;
                    }
                    out.extend(x);
                    out.extend(y);
                }
            }
            Workload::Partition(a, b) => {
                let (first, count) = self.writers(0, processes);
                if process < first + count {
                    tag(0, a.records(order, count, process - first)).collect()
                } else {
                    let (first, count) = self.writers(1, processes);
                    tag(1, b.records(order, count, process - first)).collect()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_record_is_written_by_exactly_one_process(order in 1u64..40, processes in 1u64..9, p in 0usize..7) {
            let pattern = PATTERNS[p];
            let mut seen = vec![0u32; (order * order) as usize];
            for process in 0..processes {
                for record in pattern.records(order, processes, process) {
                    seen[record as usize] += 1;
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
        }
    }

    proptest! {
        #[test]
        fn two_array_workloads_write_every_record_of_both_once(order in 1u64..30, processes in 2u64..9, w in 0usize..8) {
            let workload = TWO_ARRAYS[w];
            let mut seen = vec![vec![0u32; (order * order) as usize]; 2];
            for process in 0..processes {
                for (array, record) in workload.writes(order, processes, process) {
                    let (first, count) = workload.writers(array, processes);
                    prop_assert!(process >= first && process < first + count, "only the array's writers write it");
                    seen[array][record as usize] += 1;
                }
            }
            prop_assert!(seen.iter().flatten().all(|&n| n == 1));
        }
    }

    #[test]
    fn the_distributions_are_the_papers() {
        let owners = |p: Pattern| (0..16).map(|r| p.owner(r / 4, r % 4, 4, 4)).collect::<Vec<_>>();
        assert_eq!(owners(PATTERNS[0]), vec![0; 16], "wnn: all on process 0");
        assert_eq!(
            owners(PATTERNS[1]),
            vec![0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3],
            "wbb: 2x2 blocks"
        );
        assert_eq!(owners(PATTERNS[2]), vec![0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3], "wcc");
        assert_eq!(
            owners(PATTERNS[4]),
            vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
            "wcn: rows cyclic"
        );
        assert_eq!(PATTERNS[5].name(), "wnc");
        assert_eq!(TWO_ARRAYS[0].name(), "wrnnbb");
        assert_eq!(TWO_ARRAYS[1].name(), "wpnncc");
        let names: Vec<String> = TWO_ARRAYS.iter().map(|w| w.name()).collect();
        assert_eq!(names, ["wrnnbb", "wpnncc", "wrnncc", "wrnbbn", "wrbccb", "wpnnbb", "wpnbbn", "wpbccb"]);
        let round_robin = TWO_ARRAYS[0].writes(2, 4, 0);
        assert_eq!(&round_robin[..3], &[(0, 0), (1, 0), (0, 1)], "alternating between the arrays");
    }

    #[test]
    fn wss_is_none_cyclic_in_rounds() {
        let wss = Workload::Synchronous;
        assert_eq!(wss.name(), "wss");
        assert_eq!(wss.arrays(), 1);
        assert!(wss.synchronous() && !Workload::One(PATTERNS[5]).synchronous());
        // 5 columns over 2 processes: process 0 writes columns 0, 2, 4 of each row.
        assert_eq!(wss.writes(5, 2, 0), Workload::One(PATTERNS[5]).writes(5, 2, 0));
        assert_eq!(wss.rounds(5, 2), 15);
        let mut seen = [0u32; 25];
        for process in 0..2 {
            for (_, record) in wss.writes(5, 2, process) {
                seen[record as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }
}
