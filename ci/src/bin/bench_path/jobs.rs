//! The jobs every arm runs: 4 KiB random reads and writes at queue depth 1
//! and 8, and 1 MiB sequential writes at depth 8, each with 1 and 2
//! submitting threads (a device's queues). Names say op, size, depth and
//! threads, as the JSON keys them.

use sched::Op;

use casblk_ci::frontend::Pattern;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub op: Op,
    pub pattern: Pattern,
    pub block_bytes: u64,
    pub queue_depth: usize,
    pub threads: u16,
}

impl Job {
    pub fn name(&self) -> String {
        let op = match (self.op, self.pattern) {
            (Op::Read, Pattern::Random) => "randread",
            (Op::Write, Pattern::Random) => "randwrite",
            (Op::Read, Pattern::Sequential) => "seqread",
            (Op::Write, Pattern::Sequential) => "seqwrite",
            (op, _) => panic!("no job sends {op:?}"),
        };
        let size = match self.block_bytes {
            b if b >= 1 << 20 => format!("{}m", b >> 20),
            b => format!("{}k", b >> 10),
        };
        format!("{op}_{size}_qd{}_t{}", self.queue_depth, self.threads)
    }

    pub fn writes(&self) -> bool {
        self.op == Op::Write
    }
}

/// The table, reads first.
pub fn all() -> Vec<Job> {
    let mut jobs = Vec::new();
    for op in [Op::Read, Op::Write] {
        for threads in [1, 2] {
            for queue_depth in [1, 8] {
                jobs.push(Job { op, pattern: Pattern::Random, block_bytes: 4096, queue_depth, threads });
            }
        }
    }
    for threads in [1, 2] {
        jobs.push(Job {
            op: Op::Write,
            pattern: Pattern::Sequential,
            block_bytes: 1 << 20,
            queue_depth: 8,
            threads,
        });
    }
    jobs
}

/// The job of the table named `name`.
pub fn named(name: &str) -> Option<Job> {
    all().into_iter().find(|j| j.name() == name)
}

/// The job whose CPU ratio the targets name.
pub const RANDREAD: &str = "randread_4k_qd8_t1";
pub const RANDWRITE: &str = "randwrite_4k_qd8_t1";
