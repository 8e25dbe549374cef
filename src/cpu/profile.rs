//! ROCMFORGE_CPU_PROFILE=1: where RFCPU's graph time goes, per kind of node (op; weight type,
//! shape and batch width for matrix products). For each node: the wall time from the barrier
//! before it to the barrier after it (as thread 0 sees it), the busiest thread's compute and the
//! threads' mean compute. Wall above busiest is barrier cost; busiest above mean is an uneven
//! split. MUL_MAT rows also show the weight bytes read per second of wall time (a token's
//! products stream the weights from memory: compare with `membw`). Printed on stderr when the
//! backend is freed. Off: one branch per node.

use crate::ggml_types::op;
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

#[derive(Default, Clone, Copy)]
struct Row {
    count: u64,
    wall_ns: u64,
    busiest_ns: u64,
    mean_ns: f64,
    /// Weight bytes of the MUL_MAT nodes counted.
    weight_bytes: u64,
}

/// One graph's raw times, written by the threads, then folded into the rows by `finish`.
pub struct Profile {
    epoch: Instant,
    nth: usize,
    /// Compute time of node k on thread i at [k * nth + i].
    busy: Vec<AtomicU64>,
    /// Thread 0's clock before node 0 and after each node's barrier.
    stamps: Vec<AtomicU64>,
    rows: BTreeMap<String, Row>,
    graphs: u64,
}

/// What a node is called in the table: the op, and for products the weight type and shape
/// (K x M) and how many columns (1, 2–15, 16+: generation, small batches, prompts).
fn kind(node: &Tensor) -> String {
    let name = op::name(node.op());
    match node.op() {
        op::MUL_MAT | op::MUL_MAT_ID => {
            let (w, ne) = node
                .src(0)
                .map_or(("?", [0; 4]), |s| (s.dtype().name(), s.ne()));
            let cols = if node.op() == op::MUL_MAT {
                node.ne()[1]
            } else {
                node.src(1).map_or(1, |s| s.ne()[2])
            };
            let width = match cols {
                0 | 1 => "1",
                2..=15 => "2-15",
                _ => "16+",
            };
            format!("{name} {w} {}x{} n={width}", ne[0], ne[1])
        }
        _ => name.to_string(),
    }
}

impl Profile {
    pub fn new() -> Profile {
        Profile {
            epoch: Instant::now(),
            nth: 1,
            busy: Vec::new(),
            stamps: Vec::new(),
            rows: BTreeMap::new(),
            graphs: 0,
        }
    }

    /// Makes room for a graph of `n_nodes` nodes on `nth` threads.
    pub fn start(&mut self, n_nodes: usize, nth: usize) {
        self.nth = nth;
        let want = n_nodes * nth;
        if self.busy.len() < want {
            self.busy.resize_with(want, || AtomicU64::new(0));
        }
        if self.stamps.len() < n_nodes + 1 {
            self.stamps.resize_with(n_nodes + 1, || AtomicU64::new(0));
        }
    }

    /// Graphs folded in so far.
    pub fn graphs(&self) -> u64 {
        self.graphs
    }

    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Thread `ith` computed node `k` from `t0` until now.
    pub fn computed(&self, k: usize, ith: usize, t0: u64) {
        self.busy[k * self.nth + ith].store(self.now().saturating_sub(t0), Relaxed);
    }

    /// Thread 0's clock at slot `k` (0: before the first node; k + 1: after node k's barrier).
    pub fn stamp(&self, k: usize) {
        self.stamps[k].store(self.now(), Relaxed);
    }

    /// Folds a finished graph into the table.
    pub fn finish(&mut self, nodes: &[Tensor]) {
        self.graphs += 1;
        for (k, node) in nodes.iter().enumerate() {
            let wall = self.stamps[k + 1]
                .load(Relaxed)
                .saturating_sub(self.stamps[k].load(Relaxed));
            let times = &self.busy[k * self.nth..(k + 1) * self.nth];
            let busiest = times.iter().map(|t| t.load(Relaxed)).max().unwrap_or(0);
            let sum: u64 = times.iter().map(|t| t.load(Relaxed)).sum();
            let row = self.rows.entry(kind(node)).or_default();
            row.count += 1;
            row.wall_ns += wall;
            row.busiest_ns += busiest;
            row.mean_ns += sum as f64 / self.nth as f64;
            // MUL_MAT reads its whole weight; MUL_MAT_ID only the experts used (not counted).
            if node.op() == op::MUL_MAT {
                row.weight_bytes += node.src(0).map_or(0, |w| w.nbytes() as u64);
            }
        }
    }

    /// The table, rows by wall time.
    pub fn report(&self) -> String {
        let total: u64 = self.rows.values().map(|r| r.wall_ns).sum();
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1.wall_ns));
        let mut s = format!(
            "RFCPU profile: {} graphs on {} threads, {:.1} ms of nodes\n{:<36} {:>8} {:>10} {:>6} {:>10} {:>10} {:>8}\n",
            self.graphs,
            self.nth,
            total as f64 / 1e6,
            "node",
            "count",
            "wall ms",
            "share",
            "busiest ms",
            "mean ms",
            "GB/s"
        );
        for (name, r) in rows {
            let gbs = if r.weight_bytes > 0 {
                format!("{:.1}", r.weight_bytes as f64 / r.wall_ns.max(1) as f64)
            } else {
                String::new()
            };
            s += &format!(
                "{:<36} {:>8} {:>10.2} {:>5.1}% {:>10.2} {:>10.2} {:>8}\n",
                name,
                r.count,
                r.wall_ns as f64 / 1e6,
                100.0 * r.wall_ns as f64 / total.max(1) as f64,
                r.busiest_ns as f64 / 1e6,
                r.mean_ns / 1e6,
                gbs
            );
        }
        s
    }
}

impl Default for Profile {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_sums_rows_by_kind() {
        let mut p = Profile::new();
        p.nth = 2;
        p.rows.insert(
            "MUL_MAT q4_0 n=16+".into(),
            Row {
                count: 2,
                wall_ns: 3_000_000,
                busiest_ns: 2_500_000,
                mean_ns: 2_000_000.0,
                weight_bytes: 6_000_000,
            },
        );
        p.rows.insert(
            "ADD".into(),
            Row {
                count: 1,
                wall_ns: 1_000_000,
                busiest_ns: 500_000,
                mean_ns: 400_000.0,
                weight_bytes: 0,
            },
        );
        let r = p.report();
        let lines: Vec<&str> = r.lines().collect();
        assert!(lines[0].contains("4.0 ms"), "{r}");
        assert!(lines[2].starts_with("MUL_MAT q4_0 n=16+"), "{r}");
        assert!(lines[2].contains("75.0%"), "{r}");
        // 6 MB of weights in 3 ms of wall time.
        assert!(lines[2].trim_end().ends_with(" 2.0"), "{r}");
        assert!(lines[3].starts_with("ADD"), "{r}");
    }
}
